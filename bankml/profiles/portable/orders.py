"""The portable profile's float orders as IR data (what `bankml ir --profile portable` shows).

Every order names the function of bankml/profiles/portable/ that defines its bits; none
depends on shapes, thread counts or the backend, so the passes attach them by op alone
(bankml/passes/choose_portable_orders.py). Common to all: f32 steps rounded one at a time
(no FMA), denormals flushed to signed zero, one NaN; sums in 8 lanes folded by a balanced
tree ("tree8"); dot products exact per group of 256 and rounded once ("exact256").
"""
from __future__ import annotations

from bankml.ir.order import FloatOrder
from bankml.quants import kv_cache

PROFILE = "portable"
ACT_TYPE = "pq8"          # activation blocks of 32 codes at m*2^e scales (quant.quantize_act)
CACHE_TYPE = kv_cache.I8_ROWS  # K/V cache rows: int8 codes and one f16 scale (attention.cache_row)

# quant.quantize_act: per 32, m*2^e with m in 8..15, codes rint(x / scale) within +-127
QUANTIZE = FloatOrder("portable.quantize_act")
# quant.mul_mat: exact sums of integer products per group of 256, rounded once, groups in order
MUL_MAT = FloatOrder("portable.group_dot", fold="exact256")
# ActScaling PerBlock (load(act_scaling="PerBlock")): quant.quantize_blocks per the weight's own
# block, m in 128..255; coded.dot_blocks: each weight block's terms exact, rounded once, in order
QUANTIZE_BLOCKS = FloatOrder("portable.quantize_blocks")
MUL_MAT_BLOCKS = FloatOrder("portable.dot_blocks", fold="exact_block")
# attention.attention(..., PerBlock): each query head quantized as one block (quantize_head)
FLASH_ATTN_BLOCKS = FloatOrder("portable.attention_i8_per_block", lanes=8, fold="tree8", expf="portable")
SCALINGS = ("Sub32", "PerBlock")   # quant.ActScaling's values; the graph's g.meta["act_scaling"]
# quant.get_rows: each weight's exact value rounded once
GET_ROWS = FloatOrder("portable.get_rows")
# funcs.rmsnorm: (x * rsqrt(fold_sum(x*x) / n + eps)) * w
RMS_NORM = FloatOrder("portable.rmsnorm", lanes=8, fold="tree8")
# arith.add / arith.mul: one rounding, flush to zero
ELEMENTWISE = FloatOrder("portable.f32")
# rotary.rope_table + rotary.rope: a cos/sin table from exact turns, three roundings per output
ROPE = FloatOrder("portable.rope_table")
# funcs.silu(gate) * up, silu(x) = x * recip(1 + exp(-x))
SWIGLU = FloatOrder("portable.swiglu", expf="portable")
# attention.cache_row: int8 codes, f16 row scale absmax/127
SET_ROWS = FloatOrder("portable.set_rows_i8", f16_at=("row_scale",))
# attention.attention: exact scores, softmax (tree8 sum, one recip), 8-bit V weights per 32 cells
FLASH_ATTN = FloatOrder("portable.attention_i8", lanes=8, fold="tree8", expf="portable")
# funcs.silu / funcs.sigmoid / funcs.softplus per element
SILU = FloatOrder("portable.silu", expf="portable")
SIGMOID = FloatOrder("portable.sigmoid", expf="portable")
SOFTPLUS = FloatOrder("portable.softplus", expf="portable")
# funcs.l2norm: x * rsqrt(fold_sum(x*x) + eps) (the ggml graph's rms_norm(eps/n) then scale(1/sqrt n))
L2_NORM = FloatOrder("portable.l2norm", lanes=8, fold="tree8")
# gdn.conv_sum per token: the ring's rows then the token against the taps, from +0 in tap order
SSM_CONV = FloatOrder("portable.conv_sum")
# gdn.gdn_row per token, v-head and value row: the state f32, decay funcs.exp(g), fdot in 8 lanes
GATED_DELTA_NET = FloatOrder("portable.gdn_row", lanes=8, fold="tree8", expf="portable")
