"""The llvm kernels of the portable profile (backends/llvm/portable/ops.py, backends/llvm/portable/attention.py,
backends/llvm/portable/funcs.py) against the numpy spec (bankml/profiles/portable/), bit for bit, on edge cases, for thread splits 1, 2, 3."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from llvmlite import ir

from bankml.backends.llvm import jit
from bankml.backends.llvm.portable import funcs as pm
from bankml.backends.llvm.emit.core import f32, for_range, i8p, i64, new_function, typed, v8f32
from bankml.errors import LoweringError
from bankml.ir.dims import Dim
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import attention, funcs, orders as po, rotary
from bankml.profiles.portable.arith import add, mul
from bankml.profiles.portable.quant import ActScaling
from tests.backends.llvm.llvm_kernel_util import compile_kernel, graph_of, run_kernel

EPS = 9.999999974752427e-07
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 2.0 ** -126, -(2.0 ** -126), 1.0, -1.0,
                    0.5, 88.7, 89.0, 89.5, -103.9, -104.0, -105.0, 3.4e38, -3.4e38, 1e-30, 1e30, 20.0, -20.0],
                   np.float32)
ODD_NANS = np.array([0x7F800001, 0xFFC00000, 0xFFFFFFFF, 0x00000001, 0x807FFFFF], np.uint32).view(np.float32)


def _same(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    g, w = got.view(np.uint8).reshape(len(got.reshape(-1)), -1), want.view(np.uint8).reshape(len(want.reshape(-1)), -1)
    bad = np.nonzero((g != w).any(-1))[0]
    assert bad.size == 0, f"{what}: {bad.size} values differ, first at {bad[:5]}: {got.reshape(-1)[bad[:3]]} " \
                          f"want {want.reshape(-1)[bad[:3]]}"


def _values(n: int, seed: int, scale: float = 3.0) -> np.ndarray:
    """n f32 values: normal ones, every special (signed zeros, denormals, infinities, NaNs with
    payloads and signs), and random bit patterns."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    k = min(n // 4, len(SPECIAL) + len(ODD_NANS))
    pos = rng.choice(n, size=k, replace=False)
    x[pos] = np.concatenate([SPECIAL, ODD_NANS])[:k]
    bits = rng.integers(0, 2 ** 32, n // 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x[rng.choice(n, size=len(bits), replace=False)] = bits
    return x


def _pgraph(*nodes):
    g = graph_of(*nodes)
    g.meta["profile"] = "portable"
    return g


def _run_all_nth(g, n, out_shape, out_dtype, ins, sizes=None, fill=np.nan):
    kern = compile_kernel(g, n)
    outs = []
    for nth in (1, 2, 3):
        out = np.full(out_shape, fill, out_dtype) if out_dtype != "raw" else ins[0].copy()
        outs.append((nth, run_kernel(g, n, out, ins, nth, sizes, kernel=kern)))
    return outs


# ---------------------------------------------------------------- the f32 functions

def _function_module(name: str, emit):
    """A test kernel: out[i] = emit(canon(x[i])) over n values, scalar (name_0) and 8 lanes (name_1)."""
    m = ir.Module()
    for vec in (0, 1):
        fn, b = new_function(m, f"{name}_{vec}", ir.FunctionType(ir.VoidType(), [i8p, i8p, i64]))
        out, src, count = fn.args
        po_, ps = typed(b, out, f32), typed(b, src, f32)
        t = v8f32 if vec else f32
        with for_range(b, 0, count, 8 if vec else 1) as i:
            p_in, p_out = b.gep(ps, [i]), b.gep(po_, [i])
            if vec:
                p_in, p_out = b.bitcast(p_in, t.as_pointer()), b.bitcast(p_out, t.as_pointer())
            b.store(emit(b, pm.canon(b, b.load(p_in, align=4))), p_out, align=4)
        b.ret_void()
    return jit.compile_module(m)


FUNCS = {"exp": (pm.exp, funcs.exp), "recip": (pm.recip, funcs.recip), "rsqrt": (pm.rsqrt, funcs.rsqrt),
         "sigmoid": (pm.sigmoid, funcs.sigmoid), "silu": (pm.silu, funcs.silu), "ln": (pm.ln, funcs.ln),
         "softplus": (pm.softplus, funcs.softplus),
         # ln1p is defined for t >= 0 (softplus calls it there): of |x|
         "ln1p": (lambda b, x: pm.ln1p(b, pm.fabs(b, x)), lambda x: funcs.ln1p(np.abs(x))),
         "tree8": (lambda b, x: pm.splat(b, pm.tree(b, x), x.type) if isinstance(x.type, ir.VectorType) else x, None)}


def _edge_inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    tables = [np.ldexp(np.float32(1), np.arange(-130, 128)).astype(np.float32)]    # every binade edge
    tables.append(np.nextafter(tables[0], np.float32(0)))                          # just below each
    exp_edges = (np.arange(-6700, 5800, 7) * np.log(2) / 64).astype(np.float32)    # exp's table points and n ties
    x = np.concatenate([SPECIAL, ODD_NANS, -SPECIAL, *tables, -tables[0], exp_edges,
                        np.linspace(-110, 95, 4000, dtype=np.float32), rng.standard_normal(4000).astype(np.float32) * 40,
                        rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    return x[: len(x) // 8 * 8]


@pytest.mark.parametrize("name", [k for k in FUNCS if k != "tree8"])
def test_functions_bits_equal_spec_scalar_and_8_lanes(name):
    emit, spec = FUNCS[name]
    eng = _function_module(name, emit)
    x = _edge_inputs()
    with np.errstate(all="ignore"):
        want = spec(x)
    for vec in (0, 1):
        out = np.zeros_like(x)
        fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            eng.get_function_address(f"{name}_{vec}"))
        fn(out.ctypes.data, x.ctypes.data, len(x))
        _same(out, want, f"{name} {'8 lanes' if vec else 'scalar'}")


@pytest.mark.parametrize("name", ["exp", "recip", "sigmoid", "silu", "ln", "ln1p", "softplus"])
def test_functions_on_a_sweep_of_bit_patterns(name):
    """Every 4099th f32 bit pattern (every binade, both signs, NaNs and denormals): exp, recip
    and sigmoid skip the canon of steps that cannot need it; the bits stay the spec's."""
    emit, spec = FUNCS[name]
    eng = _function_module(f"sweep_{name}", emit)
    x = np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = x[: len(x) // 8 * 8]
    with np.errstate(all="ignore"):
        want = spec(x)
    out = np.zeros_like(x)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        eng.get_function_address(f"sweep_{name}_1"))
    fn(out.ctypes.data, x.ctypes.data, len(x))
    _same(out, want, f"{name} 8 lanes")


def test_functions_emit_no_fma_and_no_fast_math():
    m = ir.Module()
    fn, b = new_function(m, "f", ir.FunctionType(ir.VoidType(), [i8p]))
    p = b.bitcast(fn.args[0], v8f32.as_pointer())
    x = pm.canon(b, b.load(p))
    b.store(pm.silu(b, pm.add(b, pm.mul(b, x, x), pm.rsqrt(b, x))), p)
    b.ret_void()
    text = str(m)
    assert "fma" not in text and " fast " not in text and "contract" not in text
    assert "vfmadd" not in jit.asm(m, optimize=True)


# ---------------------------------------------------------------- RMS_NORM, ADD, MUL, SWIGLU

def _inp(i, shape, dtype="f32"):
    return Node(i, Op.INPUT, (), shape, dtype)


@pytest.mark.parametrize("shape", [(7, 576), (1, 576), (5, 4, 128), (3, 9, 64), (4, 60), (2, 8)], ids=str)
def test_rms_norm_bits_equal_spec(shape):
    g = _pgraph(_inp(0, shape))
    n = g.add(Node(1, Op.RMS_NORM, (0,), shape, "f32", "norm-0", po.RMS_NORM, {"eps": EPS}))
    x = _values(int(np.prod(shape)), sum(shape)).reshape(shape)
    np.seterr(all="ignore")
    x[0] = np.abs(x[0]) * 1e-20                          # a row whose mean square is denormal: eps holds it
    if shape[0] > 2:
        x[1] = 0.0
        x[2] = x[2] * np.float32(1e30)                   # sums overflowing to inf
    want = funcs.rmsnorm(x, None, EPS)
    for nth, out in _run_all_nth(g, n, shape, np.float32, [x]):
        _same(out, want, f"nth={nth}")


@pytest.mark.parametrize("op,eps", [(Op.RMS_NORM, 1e-40), (Op.L2_NORM, 3e-41)], ids=["rms_norm", "l2_norm"])
def test_norms_read_a_denormal_eps_as_zero(op, eps):
    """eps is an operand of the profile's add: a denormal one reads as 0 (rows whose squares sum
    near 2^-124 show it)."""
    shape = (4, 64)
    order = po.RMS_NORM if op is Op.RMS_NORM else po.L2_NORM
    g = _pgraph(_inp(0, shape))
    n = g.add(Node(1, op, (0,), shape, "f32", "norm-0", order, {"eps": eps}))
    x = (np.random.default_rng(1).standard_normal(shape) * np.float32(2.0 ** -62)).astype(np.float32)
    spec = (lambda v: funcs.rmsnorm(v, None, eps)) if op is Op.RMS_NORM else (lambda v: funcs.l2norm(v, eps))
    want = spec(x)
    for nth, out in _run_all_nth(g, n, shape, np.float32, [x]):
        _same(out, want, f"nth={nth}")


@pytest.mark.parametrize("op", [Op.ADD, Op.MUL])
@pytest.mark.parametrize("a_shape,b_shape", [((7, 576), (7, 576)), ((5, 4, 128), (128,)), ((3, 576), (1, 576)),
                                             ((3, 20), (20,)), ((6, 9), (6, 9))], ids=str)
def test_elementwise_bits_equal_spec(op, a_shape, b_shape):
    g = _pgraph(_inp(0, a_shape), Node(1, Op.WEIGHT, (), b_shape, "F32"))
    n = g.add(Node(2, op, (0, 1), a_shape, "f32", "x", po.ELEMENTWISE))
    a = _values(int(np.prod(a_shape)), 1).reshape(a_shape)
    bv = _values(int(np.prod(b_shape)), 2).reshape(b_shape)
    with np.errstate(all="ignore"):
        want = (add if op is Op.ADD else mul)(a, bv)
    for nth, out in _run_all_nth(g, n, a_shape, np.float32, [a, bv]):
        _same(out, want, f"nth={nth}")


def test_elementwise_with_a_symbolic_row_count():
    T = Dim("T", 1, 64)
    g = _pgraph(_inp(0, (T, 64)), Node(1, Op.WEIGHT, (), (64,), "F32"))
    n = g.add(Node(2, Op.MUL, (0, 1), (T, 64), "f32", "x", po.ELEMENTWISE))
    a, w = _values(5 * 64, 3).reshape(5, 64), _values(64, 4)
    kern = compile_kernel(g, n)
    for nth in (1, 2, 3):
        out = run_kernel(g, n, np.full((5, 64), np.nan, np.float32), [a, w], nth, {"T": 5}, kernel=kern)
        _same(out, mul(a, w), f"nth={nth}")


@pytest.mark.parametrize("shape", [(7, 1536), (1, 1536), (2, 40), (3, 20)], ids=str)    # 32, 8, 1 lanes
def test_swiglu_bits_equal_spec(shape):
    g = _pgraph(_inp(0, shape), _inp(1, shape))
    n = g.add(Node(2, Op.SWIGLU, (0, 1), shape, "f32", "ffn_swiglu-0", po.SWIGLU))
    gate, up = _values(int(np.prod(shape)), 5, 8.0).reshape(shape), _values(int(np.prod(shape)), 6).reshape(shape)
    with np.errstate(all="ignore"):
        want = mul(funcs.silu(gate), up)
    for nth, out in _run_all_nth(g, n, shape, np.float32, [gate, up]):
        _same(out, want, f"nth={nth}")


def test_wrong_order_is_refused():
    g = _pgraph(_inp(0, (2, 8)))
    n = g.add(Node(1, Op.RMS_NORM, (0,), (2, 8), "f32", "norm-0", po.ELEMENTWISE, {"eps": EPS}))
    with pytest.raises(LoweringError, match="portable"):
        compile_kernel(g, n)


# ---------------------------------------------------------------- ROPE

ROPE_PARAMS = {"n_ctx_orig": 32768, "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}


@pytest.mark.parametrize("mode,heads,hd,base", [("norm", 9, 64, 10000.0), ("neox", 4, 128, 1000000.0),
                                                ("norm", 3, 128, 100000.0), ("neox", 2, 64, 10000.0),
                                                ("norm", 2, 20, 10000.0), ("neox", 3, 36, 500000.0)],  # 8 lanes, 1 lane
                         ids=str)
def test_rope_bits_equal_spec(mode, heads, hd, base):
    pos = np.array([0, 1, 2, 7, 255, 256, 1023, 1099, 4095, 65535, 99991, 131071], np.int32)
    T = len(pos)
    g = _pgraph(_inp(0, (T, heads, hd)), _inp(1, (T,), "i32"))
    params = {**ROPE_PARAMS, "mode": mode, "n_dims": hd, "freq_base": base, "freq_scale": 1.0}
    n = g.add(Node(2, Op.ROPE, (0, 1), (T, heads, hd), "f32", "Qcur-0", po.ROPE, params))
    x = _values(T * heads * hd, hd + heads).reshape(T, heads, hd)
    cos, sin = rotary.rope_table(pos, hd, base, 1.0)
    with np.errstate(all="ignore"):
        want = rotary.rope(x, cos, sin, mode)
    for nth, out in _run_all_nth(g, n, x.shape, np.float32, [x, pos]):
        _same(out, want, f"nth={nth}")


def test_rope_refuses_yarn():
    g = _pgraph(_inp(0, (1, 2, 64)), _inp(1, (1,), "i32"))
    params = {**ROPE_PARAMS, "mode": "norm", "n_dims": 64, "freq_base": 1e4, "freq_scale": 0.25, "ext_factor": 1.0}
    n = g.add(Node(2, Op.ROPE, (0, 1), (1, 2, 64), "f32", "Qcur-0", po.ROPE, params))
    with pytest.raises(LoweringError, match="YaRN"):
        compile_kernel(g, n)


# ---------------------------------------------------------------- SET_ROWS

@pytest.mark.parametrize("hkv,d", [(3, 64), (2, 128), (2, 20)], ids=str)      # 20: one value at a time
def test_set_rows_bits_equal_spec(hkv, d):
    T, kv = 9, 256
    rng = np.random.default_rng(d)
    vals = (rng.standard_normal((T, hkv, d)) * 2).astype(np.float32)
    vals[0, 0] = 0.0                                            # scale 0: codes 0
    vals[0, 1, 3] = np.nan                                      # a NaN row
    vals[1, 0, 5] = np.inf                                      # an infinite row
    vals[1, 1] = np.float32(1e-40)                              # denormals read as zero
    vals[2, 0] = rng.integers(-127, 128, d) * np.float32(0.5)   # x / s near .5 ties
    vals[2, 0, 0] = np.float32(63.5)
    vals[3, 0] = vals[3, 0] * np.float32(1e5)                   # f16 scale overflows: codes 0
    vals[4, 1] = vals[4, 1] * np.float32(1e-9)                  # f16 scale denormal in f16
    vals[5, 0, :7] = _values(7, 1)[:7]
    s = np.float32(np.float16(0.0137))                          # x = s·(k + 1/2): r(x·recip(s)) by
    vals[6, 0] = s * (rng.integers(0, 126, d) + np.float32(0.5))  # either side of the tie
    vals[6, 0, 0] = s * np.float32(127)
    pos = np.array([0, 5, 17, 255, 100, 101, 3, 4, 2], np.int32)
    cache = np.zeros((kv, hkv), attention.cache_dtype(d))
    cache[:] = attention.cache_row(rng.standard_normal((kv, hkv, d)).astype(np.float32))
    g = _pgraph(Node(0, Op.CACHE, (), (kv, hkv, d), po.CACHE_TYPE, None, None, {"layer": 0, "kind": "k"}),
                 _inp(1, (T, hkv, d)), _inp(2, (T,), "i32"))
    n = g.add(Node(3, Op.SET_ROWS, (0, 1, 2), (kv, hkv, d), po.CACHE_TYPE, "cache_k_l0", po.SET_ROWS))
    want = cache.copy()
    with np.errstate(all="ignore"):
        want[pos] = attention.cache_row(vals)
    kern = compile_kernel(g, n)
    for nth in (1, 2, 3):
        c = cache.copy()
        run_kernel(g, n, c, [c, vals, pos], nth, kernel=kern)
        _same(c, want, f"nth={nth}")


# ---------------------------------------------------------------- FLASH_ATTN

MODELS = {"smollm2": (9, 3, 64), "qwen3": (4, 2, 128)}          # n_head, n_head_kv, head_dim


def _attn_case(seed, m, n_past, model, n_kv=None):
    h, hkv, d = MODELS[model]
    rng = np.random.default_rng(seed)
    used = n_past + m
    n_kv = n_kv or max(256, -(-used // 256) * 256)
    q = (rng.standard_normal((m, h, d)) * 2.5).astype(np.float32)
    k = np.zeros((n_kv, hkv), attention.cache_dtype(d))
    v = np.zeros((n_kv, hkv), attention.cache_dtype(d))
    k[:used] = attention.cache_row((rng.standard_normal((used, hkv, d)) * 2.5).astype(np.float32))
    v[:used] = attention.cache_row(rng.standard_normal((used, hkv, d)).astype(np.float32))
    pos = n_past + np.arange(m)
    cell = np.arange(n_kv)
    mask = np.where((cell[None, :] < used) & (cell[None, :] <= pos[:, None]), 0.0, -np.inf).astype(np.float16)
    return q, k, v, mask, float(np.float32(1.0 / np.sqrt(d)))


def _attn_check(q, k, v, mask, scale, symbolic=False, per_block=False):
    M, H, D = q.shape
    n_kv, hkv = k.shape
    MT, KV = (Dim("T", 1, 512), Dim("KV", 256, 2048)) if symbolic else (M, n_kv)
    cache = lambda i, kind: Node(i, Op.CACHE, (), (KV, hkv, D), po.CACHE_TYPE, None, None,  # noqa: E731
                                 {"layer": 0, "kind": kind})
    g = _pgraph(_inp(0, (MT, H, D)), cache(1, "k"), cache(2, "v"), _inp(3, (MT, KV), "f16"))
    order, scaling = (po.FLASH_ATTN_BLOCKS, ActScaling.PER_BLOCK) if per_block else (po.FLASH_ATTN, ActScaling.SUB32)
    n = g.add(Node(4, Op.FLASH_ATTN, (0, 1, 2, 3), (MT, H, D), "f32", None, order, {"scale": scale}))
    with np.errstate(all="ignore"):
        want = attention.attention(q, k, v, mask.astype(np.float32), scale, scaling)
    sizes = {"T": M, "KV": n_kv} if symbolic else None
    for nth, out in _run_all_nth(g, n, (M, H, D), np.float32, [q, k, v, mask], sizes):
        _same(out, want, f"nth={nth}")
    return want


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("m,n_past", [(1, 0), (1, 200), (7, 0), (7, 120), (65, 0), (3, 1097)], ids=str)
def test_flash_attn_bits_equal_spec(model, m, n_past):
    _attn_check(*_attn_case(m * 1000 + n_past, m, n_past, model), symbolic=(m == 7))


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("m,n_past", [(1, 0), (7, 120), (3, 1097)], ids=str)
def test_flash_attn_per_block_bits_equal_spec(model, m, n_past):
    """ActScaling PerBlock's attention (each q head one block of wide scale): random rows, and
    rows with a NaN, an infinity, denormals, zeros and huge values."""
    q, k, v, mask, scale = _attn_case(m * 77 + n_past, m, n_past, model)
    q[0, 0, 3] = np.nan
    q[0, 1, :32] = np.float32(1e-40)
    if m > 2:
        q[1, 0] = 0.0
        q[2] *= np.float32(1e30)
        q[1, 1, 7] = np.inf
    _attn_check(q, k, v, mask, scale, symbolic=(m == 7), per_block=True)


@pytest.mark.parametrize("model", list(MODELS))
def test_flash_attn_edges(model):
    q, k, v, mask, scale = _attn_case(5, 6, 40, model)
    h, hkv, d = MODELS[model]
    mask[0] = -np.inf                                           # an all-masked row: -0.0
    q[1, 0, 3] = np.nan                                         # a NaN: that head's row is NaN
    q[1, 1, 7] = np.inf                                         # an infinity: a bad block, NaN
    q[2, 0, :32] = np.float32(1e-40)                            # a block of denormals: zero
    q[2, 1, :32] *= np.float32(2.0 ** -60)                      # block exponents far apart: the wide exact sum
    q[2, 2 % h, 32:] *= np.float32(2.0 ** 40)
    q[3, 0] = 0.0                                               # a zero row
    q[4] = q[4] * np.float32(1e30)                              # scores overflow to inf: NaN rows after max
    q[5, :, :] = np.float32(0.5)                                # equal scores (ties in softmax)
    k[10, 0]["d"] = np.float16(np.nan)                          # a bad K scale: its score is NaN where live
    k[11, 0]["d"] = np.float16(6e-8)                            # a denormal f16 scale
    out = _attn_check(q, k, v, mask, scale)
    grp = h // hkv                                              # K/V head 0 holds the NaN scale
    assert np.all(out[0].view(np.uint32) == 0x80000000)         # no live cell: no positions, -0.0
    assert np.isnan(out[5, :grp]).all() and not np.isnan(out[5, grp:]).any()


def test_flash_attn_wide_spread_scores():
    """q blocks 2^100 apart: the exact score needs far more than 64 bits."""
    q, k, v, mask, scale = _attn_case(9, 2, 30, "qwen3")
    q[0, :, :32] *= np.float32(2.0 ** 60)
    q[0, :, 96:] *= np.float32(2.0 ** -60)
    q[1, :, 32:64] *= np.float32(2.0 ** 30)
    q[1, :, 64:96] = -q[1, :, 64:96] * np.float32(2.0 ** -27)
    _attn_check(q, k, v, mask, np.float32(1.0))


@pytest.mark.parametrize("model", list(MODELS))
def test_flash_attn_masked_groups(model):
    """Groups of eight masked cells anywhere in the row (the softmax skips their exp): first,
    between live cells, all but one cell, every other group; one row's max is +inf. A block of
    32 masked cells is no block: an infinite V scale in it changes nothing."""
    q, k, v, mask, scale = _attn_case(11, 5, 200, model)
    n_kv = mask.shape[1]
    cell = np.arange(n_kv)
    mask[0, :8] = -np.inf                                       # the first group masked
    mask[0, 16:32] = -np.inf                                    # two groups between live ones
    mask[1] = np.where(cell == 150, 0, -np.inf)                 # one live cell
    mask[2] = np.where((cell // 8) % 2 == 1, -np.inf, mask[2])  # every other group
    mask[3, 8:200] = -np.inf                                    # a long masked run, live cells after it
    q[4] *= np.float32(1e30)                                    # scores of +-inf: the max is +inf
    mask[4, :64] = -np.inf
    v[230, 1]["d"] = np.float16(np.inf)                         # in a block masked in every row
    k[231, 1]["d"] = np.float16(np.nan)
    v["qs"][:, :, 5] = 0                                        # every block's sum 0: +0 (the document's)
    out = _attn_check(q, k, v, mask, scale)
    assert not np.isnan(out[:4]).any() and not out[:4, :, 5].view(np.uint32).any()
