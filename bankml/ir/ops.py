"""The IR's vocabulary: one commented enum, plus named groups."""
from __future__ import annotations

from enum import Enum


class Op(Enum):
    INPUT = "input"            # a per-micro-batch input: params name in {tokens, pos, kq_mask, out_ids}
    WEIGHT = "weight"          # a model tensor: params tensor (name), ggml_type
    CACHE = "cache"            # the K or V cache of one layer: params layer, kind ("k" | "v"), cells (the whole
                               # cache's; the node's shape is the n_kv cells read); its array: kv_cache.cache_array
    GET_ROWS = "get_rows"      # rows of src0 selected by src1 (dequantized when src0 is a weight)
    RMS_NORM = "rms_norm"      # x / sqrt(mean(x^2) + eps) per row: params eps
    MUL = "mul"                # elementwise, src1 broadcast over rows
    ADD = "add"                # elementwise, src1 broadcast over rows
    QUANTIZE = "quantize"      # activation to the vec_dot type of a weight: params type ("f16" | "q8_0" | "q8_1")
    MUL_MAT = "mul_mat"        # src1 @ src0^T: src0 a weight, src1 activation (or its QUANTIZE)
    RESHAPE = "reshape"        # same bytes, new shape
    ROPE = "rope"              # rotary embedding: src0 x, src1 pos; params mode, n_dims, freq_base, ...
    SET_ROWS = "set_rows"      # write src1 (rounded to the cache type) into cache src0 at positions src2
    FLASH_ATTN = "flash_attn"  # softmax(q k^T * scale + mask) v: q, k cache, v cache, mask; params kernel
    SWIGLU = "swiglu"          # silu(src0) * src1
    GEGLU = "geglu"            # gelu(src0) * src1 (ggml's GELU: the f16 table on this build)
    SCALE = "scale"            # src0 * params scale (ggml_scale, bias 0)
    HADAMARD = "hadamard"      # rows of params n values times the n x n Walsh-Hadamard matrix / sqrt(n)
    SLICE = "slice"            # columns [params lo, hi) of each row (the last axis), copied: a ggml_view_*
                               # of every row's part, as ggml's next op or the eval callback reads it
    SILU = "silu"              # x / (1 + expf(-x)) per element (ggml_silu: ggml_v_silu, a glibc tail)
    SIGMOID = "sigmoid"        # 1 / (1 + expf(-x)) per element (ggml_sigmoid)
    SOFTPLUS = "softplus"      # x > 20 ? x : logf(1 + expf(x)) per element (ggml_softplus)
    SSM_CONV = "ssm_conv"      # causal conv of x [T, ch] by weight [ch, d_conv] after the conv state cache
                               # [ch, d_conv-1]: [T, ch]; the cache is left holding the last d_conv-1 columns
    GATED_DELTA_NET = "gated_delta_net"  # q, k [T, Hk, S], v [T, Hv, S], g, beta [T, Hv], state cache
                               # [Hv, S, S] (transposed): the outputs [T, Hv, S]; the cache left at the new state
    L2_NORM = "l2_norm"        # x / sqrt(sum(x^2) + eps) per row: params eps (the portable profile's
                               # l2norm; the ggml graph builds build_gdn_l2_norm of rms_norm and scale)


VIEWS = frozenset({Op.RESHAPE})
LEAVES = frozenset({Op.INPUT, Op.WEIGHT, Op.CACHE})
EFFECTS = frozenset({Op.SET_ROWS, Op.SSM_CONV, Op.GATED_DELTA_NET})   # write state: never dead, even unread
STATE_KINDS = ("conv", "ssm")   # CACHE kinds of a recurrent layer's state (one per sequence, no cells); else k, v

# arity of each op (inputs it takes; flash_attn's fifth, in a batch of sequences, is each row's cells)
ARITY = {
    Op.INPUT: 0, Op.WEIGHT: 0, Op.CACHE: 0, Op.GET_ROWS: 2, Op.RMS_NORM: 1, Op.MUL: 2, Op.ADD: 2,
    Op.QUANTIZE: 1, Op.MUL_MAT: 2, Op.RESHAPE: 1, Op.ROPE: 2, Op.SET_ROWS: 3, Op.FLASH_ATTN: (4, 5),
    Op.SWIGLU: 2, Op.GEGLU: 2, Op.SCALE: 1, Op.HADAMARD: 1,
    Op.SLICE: 1, Op.SILU: 1, Op.SIGMOID: 1, Op.SOFTPLUS: 1, Op.SSM_CONV: 3, Op.GATED_DELTA_NET: 6, Op.L2_NORM: 1,
}
