"""The portable profile's SPIR-V kernels on Vulkan (lavapipe in CI) equal the numpy spec bit for bit:
matvec of every weight type (fast int64 and wide sums), RMSNorm, softmax, exp/recip/rsqrt, the
int8-cache attention of a decode step, Qwen3.5's conv and Gated-DeltaNet step (gdn.conv,
gdn.gdn_row over several tokens, the state carried), and the same ops of a real SmolLM2/Qwen3
decode step.
Then whole sessions with every mul_mat, RMSNorm and attention (and Qwen3.5's conv and
Gated-DeltaNet) on the device, on SmolLM2 in four weight types, the six Qwen3 test models and
two Qwen3.5 ones: prompts of 1, 7, 9, 64 and 65 tokens (every row, or
the last) and decodes, and decodes at the 1,024th to 1,100th cell, give every op's output and
every logits row of the numpy spec, bit for bit."""
from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

import bankml
from bankml.backends.reference import run as ref_run  # its import fills LOWERINGS
from bankml.backends.reference.lowerings import LOWERINGS
from bankml.backends.spirv import builder as B, runtime
from bankml.backends.spirv.portable import kernels as PK, quantize as SQ
from bankml.backends.spirv.portable.rope import rope_run
from bankml.gguf.reader import read_gguf
from bankml.ir.ops import Op
from bankml.profiles.portable import attention as A
from bankml.profiles.portable import arith, funcs, quant
from bankml.profiles.portable import orders as po
from bankml.profiles.portable.quant import ActScaling
from bankml.quants import F16, Q1_0, Q2_0, Q4_1, Q8_0, WEIGHT_TYPES
from bankml.testing import models

F32 = np.float32
TYPES = {"F16": F16, "Q8_0": Q8_0, "Q4_1": Q4_1, "Q1_0": Q1_0, "Q2_0": Q2_0}


@pytest.fixture(scope="module", params=[False, True], ids=["device", "flushing"])
def kern(request):
    """The kernels as the device runs them, and as the worst device without DenormPreserve
    would (`flushing`: every denormal add/mul result +0, products of +-2^-126 too): the bits
    must not change."""
    k = PK.PortableKernels(runtime.open_device(0), flushing=request.param)
    yield k
    k.close()


@pytest.fixture(scope="module")
def device_kern():
    k = PK.PortableKernels(runtime.open_device(0))
    yield k
    k.close()


def _same(got, want) -> bool:
    got, want = np.asarray(got, F32), np.asarray(want, F32)
    return got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _diff(got, want) -> str:
    bad = np.flatnonzero(np.asarray(got, F32).view(np.uint32).ravel() != np.asarray(want, F32).view(np.uint32).ravel())
    return f"{bad.size} differ, first {bad[:5]}: {np.ravel(got)[bad[:5]]} vs {np.ravel(want)[bad[:5]]}"


# ---- the modules
MODULES = {f"matvec-{n}": (lambda t=t: PK.emit_matvec(t)) for n, t in TYPES.items()}
MODULES |= {"rmsnorm": PK.emit_rmsnorm, "softmax": PK.emit_softmax, "attention": PK.emit_attention}
MODULES |= {f"unary-{fn}": (lambda fn=fn: PK.emit_unary(fn)) for fn in ("exp", "recip", "rsqrt")}
MODULES |= {f"binary-{op}": (lambda op=op: PK.emit_binary(op)) for op in ("add", "sub", "mul")}
MODULES |= {"conv": lambda: PK.emit_conv(True), "conv-sum": lambda: PK.emit_conv(False), "gdn": PK.emit_gdn,
            "gdn-flush": PK.emit_gdn_flush, "gdn-fold": PK.emit_gdn_fold, "gdn-read": PK.emit_gdn_read}
MODULES |= {"attention-flushing": lambda: PK.emit_attention(True),
            "matvec-Q4_1-no-rte": lambda: PK.emit_matvec(Q4_1, rte=False)}


@pytest.mark.parametrize("name", list(MODULES))
def test_module_passes_spirv_val_and_no_float_op_may_contract(name):
    words = list(MODULES[name]())
    B.validate(words)
    text = B.disassemble(words)
    float_ops = re.findall(r"^\s*(%\S+) = Op(?:FAdd|FSub|FMul) ", text, re.M)
    assert float_ops and set(float_ops) <= set(re.findall(r"OpDecorate (%\S+) NoContraction", text))
    assert "OpExtInst" not in text and "Fma" not in text and "Float64" not in text
    assert "OpCapability Int64" in text
    assert ("OpExecutionMode %main RoundingModeRTE 32" in text) == ("no-rte" not in name)


# ---- matvec
def _rand_rows(rng, wtype: int, rows: int, k: int, scale: float = 0.02) -> np.ndarray:
    """Random rows of a weight type: random codes, normal f16 scales (and mins)."""
    if wtype == F16:
        return (rng.standard_normal((rows, k)) * scale).astype(np.float16).view(np.uint8).reshape(rows, -1)
    wt = WEIGHT_TYPES[wtype]
    r = rng.integers(0, 256, (rows, k // wt.block, wt.block_bytes), dtype=np.uint8)
    nh = 2 if wtype == Q4_1 else 1
    r[:, :, :2 * nh] = (rng.standard_normal(r.shape[:2] + (nh,)) * scale).astype(np.float16).view(np.uint8).reshape(
        rows, -1, 2 * nh)
    return r.reshape(rows, -1)


def _k_for(wtype: int, k: int) -> int:
    return k if k % WEIGHT_TYPES[wtype].block == 0 else 1536     # Q1_0 needs K % 128 == 0


def _check_matvec(kern, w, wtype, a):
    got = kern.matvec(w, wtype, a)
    want = quant.mul_mat(w, wtype, a)[0]
    assert _same(got, want), _diff(got, want)
    return got


@pytest.mark.parametrize("k", [576, 2048])
@pytest.mark.parametrize("tname", list(TYPES))
def test_matvec_random_rows(kern, tname, k):
    wtype = TYPES[tname]
    k = _k_for(wtype, k)
    rng = np.random.default_rng(k + wtype)
    w = _rand_rows(rng, wtype, 200, k)
    x = rng.standard_normal((1, k)).astype(F32) * F32(3)
    _check_matvec(kern, w, wtype, quant.quantize_act(x))


def test_mul_mat_of_several_activation_rows_in_one_dispatch(kern):
    rng = np.random.default_rng(9)
    for wtype in (Q4_1, Q1_0):
        w = _rand_rows(rng, wtype, 70, 512)
        a = quant.quantize_act(rng.standard_normal((5, 512)).astype(F32))
        got, want = kern.mul_mat(w, wtype, a), quant.mul_mat(w, wtype, a)
        assert _same(got, want), _diff(got, want)


def _acts(rng, k, e_lo, e_hi, zero_frac=0.0):
    """ActBlocks with random codes, m in 8..15 and e in [e_lo, e_hi] (the wide path's inputs)."""
    nb = k // 32
    m = rng.integers(8, 16, (1, nb)).astype(np.int64)
    m[rng.random((1, nb)) < zero_frac] = 0
    e = rng.integers(e_lo, e_hi + 1, (1, nb)).astype(np.int64)
    q = rng.integers(-127, 128, (1, k)).astype(np.int8)
    q.reshape(1, nb, 32)[m == 0] = 0
    return quant.ActBlocks(q, m, np.where(m == 0, 0, e), np.zeros((1, nb), bool))


@pytest.mark.parametrize("tname", list(TYPES))
def test_matvec_groups_spanning_hundreds_of_binades_take_the_wide_path(kern, tname):
    """Activation block exponents over the whole range a quantized f32 can have (-136..118):
    most groups' terms are far more than 64 bits apart."""
    wtype = TYPES[tname]
    k = _k_for(wtype, 576)
    rng = np.random.default_rng(7 + wtype)
    w = _rand_rows(rng, wtype, 64, k, scale=1.0)
    for seed in range(3):
        a = _acts(np.random.default_rng(seed), k, -136, 118, zero_frac=0.2)
        _check_matvec(kern, w, wtype, a)
        # spread near the int64 limit: exponents 40..70 apart
        _check_matvec(kern, w, wtype, _acts(np.random.default_rng(10 + seed), k, -40, 30))


def _q8_rows(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q8_0 rows from f16 scales [rows, nb] and int8 codes [rows, nb*32]."""
    rows, nb = d.shape
    out = np.zeros((rows, nb, 34), np.uint8)
    out[:, :, :2] = d.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    out[:, :, 2:] = q.astype(np.int8).view(np.uint8).reshape(rows, nb, 32)
    return out.reshape(rows, -1)


def _one_hot_act(m, e, nb=8):
    """Blocks of one code 1 at element 0 with the given m and e: block j is worth m_j * 2^e_j."""
    q = np.zeros((1, 32 * nb), np.int8)
    q[0, ::32] = 1
    m = np.asarray(m, np.int64)[None]
    return quant.ActBlocks(q, m, np.asarray(e, np.int64)[None], np.zeros((1, nb), bool))


def test_matvec_ties_sticky_cancellation_overflow_and_flush(kern):
    """Rows built so each group's exact value is a chosen number: 2^24 + 1 (a tie, to even),
    2^24 + 3 (a tie, up), a tie plus or minus a term 157 binades below (past SUM_WINDOW: floored
    to 0, the tie to even, or to one unit of the window's edge, down), an exact cancellation
    (fast and wide: +0), overflow (inf) and results below 2^-126 (zero of their sign); then the
    window's edge itself (below)."""
    nb = 8
    cases = [  # (weight codes at element 0 of each block (d = 1), act m, act e)
        ([1, 1, 0, 0, 0, 0, 0, 0], [8, 8, 0, 0, 0, 0, 0, 0], [21, -3, 0, 0, 0, 0, 0, 0]),     # 2^24 + 1
        ([1, 3, 0, 0, 0, 0, 0, 0], [8, 8, 0, 0, 0, 0, 0, 0], [21, -3, 0, 0, 0, 0, 0, 0]),     # 2^24 + 3
        ([1, 1, 1, 0, 0, 0, 0, 0], [8, 8, 8, 0, 0, 0, 0, 0], [21, -3, -136, 0, 0, 0, 0, 0]),  # tie + tiny
        ([1, 1, -1, 0, 0, 0, 0, 0], [8, 8, 8, 0, 0, 0, 0, 0], [21, -3, -136, 0, 0, 0, 0, 0]),  # tie - tiny
        ([1, -1, 1, -1, 0, 0, 0, 0], [8, 8, 15, 15, 0, 0, 0, 0], [5, 5, -3, -3, 0, 0, 0, 0]),  # cancels (fast)
        ([1, -1, 1, -1, 0, 0, 0, 0], [8, 8, 15, 15, 0, 0, 0, 0], [100, 100, -100, -100, 0, 0, 0, 0]),  # (wide)
        ([127, 127, 0, 0, 0, 0, 0, 0], [15, 15, 0, 0, 0, 0, 0, 0], [118, 118, 0, 0, 0, 0, 0, 0]),  # inf
        ([-127, 0, 0, 0, 0, 0, 0, 0], [15, 0, 0, 0, 0, 0, 0, 0], [118, 0, 0, 0, 0, 0, 0, 0]),  # finite, large
        ([1, 0, 0, 0, 0, 0, 0, 0], [8, 0, 0, 0, 0, 0, 0, 0], [-136, 0, 0, 0, 0, 0, 0, 0]),  # 2^-133: +0
        ([-1, 0, 0, 0, 0, 0, 0, 0], [8, 0, 0, 0, 0, 0, 0, 0], [-136, 0, 0, 0, 0, 0, 0, 0]),  # -0
        ([1, 1, 0, 0, 0, 0, 0, 0], [15, 15, 0, 0, 0, 0, 0, 0], [-130, -130, 0, 0, 0, 0, 0, 0]),  # 2^-126 - ...
        ([127, 127, 0, 0, 0, 0, 0, 0], [8, 8, 0, 0, 0, 0, 0, 0], [-136, 118, 0, 0, 0, 0, 0, 0]),
    ]
    for wq, am, ae in cases:
        q = np.zeros((1, 32 * nb), np.int8)
        q[0, ::32] = wq
        w = _q8_rows(np.ones((1, nb), np.float16), q)
        got = _check_matvec(kern, w, Q8_0, _one_hot_act(am, ae))
        assert got.shape == (1,)
    got = kern.matvec(_q8_rows(np.ones((1, nb), np.float16), np.tile([1] + [0] * 31, (1, nb))),
                      Q8_0, _one_hot_act([8, 8, 0, 0, 0, 0, 0, 0], [21, -3, 0, 0, 0, 0, 0, 0]))
    assert got[0] == F32(2 ** 24)                     # the tie went to even
    # The largest term, 2^24, is 8192 (m 8 times d's significand 1024) at 2^11: the window keeps
    # places down to 2^(11 - 64) = 2^-53. A term of 2^-53 is kept, one of 2^-54 floored.
    for wq, e3, want in [([1, 1, 1], -56, 2 ** 24 + 2),     # 2^24 + 1 + 2^-53: above the tie, up
                         ([1, 1, 1], -57, 2 ** 24),         # + 2^-54, floored to 0: the tie, even
                         ([1, 3, 1], -57, 2 ** 24 + 4),     # 2^24 + 3 + 0: the tie, even (up)
                         ([1, 3, -1], -57, 2 ** 24 + 2)]:   # 2^24 + 3 - 2^-54 floored to - 2^-53: down
        q = np.zeros((1, 32 * nb), np.int8)
        q[0, :96:32] = wq
        got = _check_matvec(kern, _q8_rows(np.ones((1, nb), np.float16), q), Q8_0,
                            _one_hot_act([8, 8, 8, 0, 0, 0, 0, 0], [21, -3, e3, 0, 0, 0, 0, 0]))
        assert got[0] == F32(want), (wq, e3)


def test_matvec_terms_at_the_int64_limit(kern):
    """F16 weights of 65504 and codes of 127: each sub-block term has 56 bits; exponents 3 apart
    keep every aligned term within 59 bits (the int64 sum), 4..6 apart do not (the wide sum)."""
    k = 256
    w = np.full((4, k), 65504.0, np.float16)
    w[1, ::2] = -65504.0
    w[2, :128] = -65504.0
    w[3, 200:] = -6.0e-8
    w = w.view(np.uint8).reshape(4, -1)
    for gap in (0, 3, 4, 6, 40):
        for sign in (1, -1):
            q = np.full((1, k), 127 * sign, np.int8)
            q[0, 32:64] *= -1
            m = np.full((1, 8), 15, np.int64)
            e = np.array([[0] + [gap] * 7], np.int64)
            _check_matvec(kern, w, F16, quant.ActBlocks(q, m, e, np.zeros((1, 8), bool)))


def test_matvec_bad_blocks_nan_inf_zero_and_denormal_activations(kern):
    rng = np.random.default_rng(3)
    k = 576
    for wtype in (F16, Q8_0, Q4_1, Q2_0):
        w = _rand_rows(rng, wtype, 48, k)
        if wtype == F16:
            h = w.view(np.float16)
            h[0, 5], h[1, 300], h[2, 7], h[3, 9] = np.inf, np.nan, 6e-8, -0.0       # bad, bad, subnormal, -0
            h[4, :] = 65504.0
        else:
            bb = WEIGHT_TYPES[wtype].block_bytes
            w[0, 0:2] = np.array([np.inf], np.float16).view(np.uint8)            # an inf scale: NaN group
            w[1, bb:bb + 2] = np.array([np.nan], np.float16).view(np.uint8)
            w[2, 0:2] = np.array([2 ** -24], np.float16).view(np.uint8)          # the least subnormal
            w[3, 0:2] = np.array([-0.0], np.float16).view(np.uint8)
            w[4, 0:2] = np.array([65504.0], np.float16).view(np.uint8)
        for x in ([np.nan], [np.inf], [1e-40, -1e-45], [0.0], [3e38, -3e38]):
            xs = rng.standard_normal((1, k)).astype(F32)
            xs[0, 40:40 + len(x)] = x
            xs[0, 256:288] = 0.0                                                  # a zero block
            _check_matvec(kern, w, wtype, quant.quantize_act(xs))


@pytest.fixture(scope="module")
def ggufs():
    files = {}
    for name in ("smollm2-q4_1", "smollm2-f16", "smollm2-q8_0", "smollm2-q2_0", "qwen3-small-q1_0"):
        files[name] = read_gguf(models.path(name))
    return files


def _tensor(gg, name: str, rows: int | None = None) -> tuple[np.ndarray, int, int]:
    t = gg.tensors[name]
    raw = gg.tensor_data(name)
    w = raw.reshape(int(np.prod(t.shape[1:])), -1)
    return (w if rows is None else w[:rows]), t.ggml_type, t.shape[0]


@pytest.mark.parametrize("model,tensor,rows", [
    ("smollm2-q4_1", "blk.0.attn_q.weight", None), ("smollm2-q4_1", "blk.0.ffn_down.weight", None),
    ("smollm2-f16", "blk.3.attn_k.weight", None), ("smollm2-f16", "blk.0.ffn_down.weight", 256),
    ("smollm2-q8_0", "token_embd.weight", 4096), ("smollm2-q2_0", "blk.1.ffn_gate.weight", None),
    ("qwen3-small-q1_0", "blk.0.ffn_down.weight", None), ("qwen3-small-q1_0", "blk.2.attn_q.weight", None),
])
def test_matvec_real_model_rows(kern, ggufs, model, tensor, rows):
    w, wtype, k = _tensor(ggufs[model], tensor, rows)
    x = np.random.default_rng(k).standard_normal((1, k)).astype(F32)
    _check_matvec(kern, w, wtype, quant.quantize_act(x))


# ---- the f32 steps
def _near_underflow_pairs(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs whose products and sums land at 2^-126 and just below it (the band where gradual
    underflow rounds up to 2^-126), at zero, and among the specials."""
    a = np.ldexp(1 + rng.integers(0, 2 ** 23, n) / 2 ** 23, rng.integers(-60, 60, n)).astype(F32)
    b = (F32(2.0 ** -126) / a).astype(F32)
    b = np.nextafter(b, b * 2 * np.sign(rng.standard_normal(n)).astype(F32))
    b = b.view(np.uint32) + rng.integers(-3, 4, n).astype(np.uint32)
    b = (b.view(F32) * np.where(rng.random(n) < 0.5, F32(-1), F32(1))).astype(F32)
    near = np.ldexp(1 + rng.integers(0, 64, n) / 2 ** 23, -126).astype(F32)
    other = -np.ldexp(1 + rng.integers(0, 64, n) / 2 ** 23, -126).astype(F32)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 2.0 ** -126, -(2.0 ** -126), 1.0, 3e38], F32)
    sa, sb = np.meshgrid(sp, sp)
    return (np.concatenate([a, near, near, sa.ravel()]), np.concatenate([b, other, -near, sb.ravel()]))


def test_add_sub_mul_near_underflow_and_specials(kern):
    from bankml.profiles.portable import arith
    a, b = _near_underflow_pairs(np.random.default_rng(5), 20000)
    for op in ("add", "sub", "mul"):
        got, want = kern.binary(op, a, b), getattr(arith, op)(a, b)
        assert _same(got, want), (op, _diff(got, want))
    assert (kern.binary("mul", a, b) == F32(2.0 ** -126)).sum() > 100      # the band is reached


# ---- exp, recip, rsqrt
def test_exp_recip_rsqrt_over_the_f32_bit_patterns_and_table_edges(kern):
    bits = np.arange(0, 2 ** 32, 9973, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 1, 0x807FFFFF,
                         0x00800000, 0x7F7FFFFF], np.uint32)
    x = np.concatenate([bits, specials]).view(F32)
    # table edges: exp's n boundaries, rsqrt's 64 and recip's 64 intervals, each with both neighbours
    n = np.arange(-6700, 5700, 7)
    edges = [(n * np.log(2) / 64).astype(F32), np.ldexp(1 + np.arange(64) / 32, 0).astype(F32),
             np.ldexp(1 + np.arange(64) / 64, -3).astype(F32)]
    e = np.concatenate(edges)
    x = np.concatenate([x, e, np.nextafter(e, F32(np.inf)), np.nextafter(e, -F32(np.inf)), [F32(-104), F32(89)]])
    for fn in ("exp", "recip", "rsqrt"):
        got, want = kern.unary(fn, x), getattr(funcs, fn)(x)
        assert _same(got, want), (fn, _diff(got, want))


# ---- rmsnorm and softmax
def _edge_rows(n: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    rows = rng.standard_normal((10, n)).astype(F32)
    rows[1] = 0.0
    rows[2, ::3] = -0.0
    rows[3, :5] = [1e-40, -1e-42, 1e-45, -3e-39, 2e-38][:n]            # denormals read as signed zeros
    rows[4, 7 % n] = np.nan
    rows[5, 1 % n] = np.inf
    rows[6] *= F32(1e19)                                                # squares overflow
    rows[7] *= F32(1e-20)                                               # squares flush
    rows[8, :] = F32(1.5)                                               # ties in the sums
    rows[9, 3 % n] = -np.inf
    return rows


@pytest.mark.parametrize("n", [576, 2048, 100, 5, 1])
def test_rmsnorm(kern, n):
    rng = np.random.default_rng(n)
    x = np.concatenate([rng.standard_normal((4, n)).astype(F32) * F32(5), _edge_rows(n)])
    w = rng.standard_normal(n).astype(F32)
    for eps, wt in ((1e-5, w), (1e-6, None), (0.0, w)):
        got, want = kern.rmsnorm(x, wt, eps), funcs.rmsnorm(x, wt, eps)
        assert _same(got, want), (eps, _diff(got, want))


@pytest.mark.parametrize("n", [4, 64, 2048])
def test_rmsnorm_quotient_at_the_flush_edge(kern, n):
    """Σx²/n is IEEE division, then ftz. With n = 2^L and Σx² = (2^24 - 1)·2^(L-150) the quotient is
    the tie (2^24 - 1)·2^-150 between two f32 steps of 2^-149, so it rounds up to 2^-126 (kept); one
    step of Σx² less and it is a denormal (flushed). The kernel divides by integers and rounds at
    24 bits first: it must agree (eps 0 shows the quotient)."""
    from bankml.profiles.portable import arith
    # rows (a, b, 0, ...): b² a third to a half of the sum, a within 4 ulps of where a² + b² = n·2^-126
    b = np.linspace(0.59, 0.7, 400) * np.sqrt(n) * 2.0 ** -63
    a0 = np.sqrt(n * 2.0 ** -126 - b * b).astype(F32).view(np.uint32).astype(np.int64)
    rows = np.zeros((b.size * 8, n), F32)
    rows[:, 0] = (a0[:, None] + np.arange(-4, 4)).astype(np.uint32).view(F32).ravel()
    rows[:, 1] = np.repeat(b.astype(F32), 8)
    s = arith.fold_sum(arith.mul(rows, rows))
    edge = F32(((1 << 24) - 1) * n * 2.0 ** -150)
    up, below = s == edge, s == np.nextafter(edge, F32(0))
    assert up.sum() >= 3 and below.sum() >= 3                         # both sides of the edge are here
    want = funcs.rmsnorm(rows, None, 0.0)
    assert np.all(want[up, 0] == arith.mul(rows[up, 0], F32(2.0 ** 63)))  # the quotient was 2^-126
    assert np.all(np.isinf(want[below, 0]))                             # flushed: rsqrt(+0) = inf
    got = kern.rmsnorm(rows, None, 0.0)
    assert _same(got, want), _diff(got, want)


@pytest.mark.parametrize("n", [576, 2048, 100, 7, 1])
def test_softmax(kern, n):
    rng = np.random.default_rng(n + 1)
    x = np.concatenate([rng.standard_normal((4, n)).astype(F32) * F32(30), _edge_rows(n)])
    extra = np.full((2, n), -np.inf, F32)                               # a row of -inf: NaN
    extra[1, 0] = 0.0                                                   # one finite value: 1 there
    x = np.concatenate([x, extra])
    got, want = kern.softmax(x), funcs.softmax(x)
    assert _same(got, want), _diff(got, want)


# ---- attention of one decode step
def _attn_case(rng, H, Hkv, D, n_kv, visible, scale_q=1.0):
    q = (rng.standard_normal((H, D)) * scale_q).astype(F32)
    k = A.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(F32))
    v = A.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(F32))
    mask = np.where(np.arange(n_kv) < visible, F32(0), F32(-np.inf)).astype(F32)
    return q, k, v, mask


def _check_attention(kern, q, k, v, mask, scale):
    got = kern.attention(q, k, v, mask, scale)
    want = A.attention(q[None], k, v, mask[None], scale)[0]
    assert _same(got, want), _diff(got, want)


@pytest.mark.parametrize("H,Hkv,D,n_kv,visible", [
    (9, 3, 64, 64, 40), (9, 3, 64, 256, 200), (8, 4, 128, 96, 96), (4, 4, 32, 32, 1), (9, 3, 64, 1120, 1100)])
def test_attention_decode_step(kern, H, Hkv, D, n_kv, visible):
    rng = np.random.default_rng(H * n_kv + D)
    q, k, v, mask = _attn_case(rng, H, Hkv, D, n_kv, visible, scale_q=3.0)
    _check_attention(kern, q, k, v, mask, 1 / np.sqrt(D))


@pytest.mark.parametrize("H,Hkv,D,M,n_kv", [(9, 3, 64, 9, 256), (4, 2, 128, 65, 96)])
def test_attention_of_several_query_rows_in_one_dispatch(kern, H, Hkv, D, M, n_kv):
    """A prefill's rows: row t sees the first n_kv - M + t + 1 cells (a causal mask), one row NaN."""
    rng = np.random.default_rng(M + D)
    q = (rng.standard_normal((M, H, D)) * 3).astype(F32)
    q[M // 2, 1, 5] = np.nan
    k = A.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(F32))
    v = A.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(F32))
    visible = np.arange(n_kv)[None, :] <= np.arange(n_kv - M, n_kv)[:, None]
    mask = np.where(visible, F32(0), F32(-np.inf)).astype(F32)
    got, want = kern.attention_rows(q, k, v, mask, 0.125), A.attention(q, k, v, mask, 0.125)
    assert _same(got, want), _diff(got, want)


def test_attention_edges(kern):
    rng = np.random.default_rng(11)
    H, Hkv, D, n_kv = 6, 2, 64, 96
    q, k, v, mask = _attn_case(rng, H, Hkv, D, n_kv, 70)
    v[:32, 0] = A.cache_row(np.zeros((32, D), F32))                 # zero V rows (scale 0)
    v[40, 1] = A.cache_row(np.full(D, 1e-3, F32))                    # one tiny row
    k[5, 1] = A.cache_row(rng.standard_normal(D).astype(F32) * F32(1e4))  # one dominating score
    _check_attention(kern, q, k, v, mask, 0.125)
    qn = q.copy()
    qn[1, 3] = np.nan                                                    # a bad q block: that head NaN
    qn[4, :] = 0.0                                                       # a zero query: uniform weights
    _check_attention(kern, qn, k, v, mask, 0.125)
    qi = q * F32(1e30)                                                   # scores overflow
    _check_attention(kern, qi, k, v, mask, 0.125)
    _check_attention(kern, q, k, v, np.zeros(n_kv, F32), 1.0)           # nothing masked
    ks, vs = k.copy(), v.copy()
    ks[80, 0]["d"], vs[90, 1]["d"] = np.nan, np.inf                      # stale bad rows, masked: no effect
    vs["qs"][:, :, 7] = 0                                                # every block's sum 0: +0
    _check_attention(kern, q, ks, vs, mask, 0.125)
    assert not np.isnan(kern.attention(q, ks, vs, mask, 0.125)).any()
    assert not kern.attention(q, ks, vs, mask, 0.125)[:, 7].view(np.uint32).any()
    _check_attention(kern, q, ks, vs, np.full(n_kv, -np.inf, F32), 0.125)   # no live cell: -0.0


# ---- the ops of a real decode step
def _decode_step_ops(name: str, n_prompt: int = 5):
    """(node, its inputs' values, its value) for every mul_mat, rms_norm and flash_attn of one
    decode step of the portable reference graph, read through the session's trace."""
    vals, graphs, masks = {}, [], []
    with bankml.load(models.path(name), backend="reference", profile="portable", n_ctx=128) as m:
        s = m.session()
        s.prefill(list(range(1, n_prompt + 1)))
        run = m.runner.run

        def capture(g, values, inputs, caches, trace=None):
            graphs.append(g)
            masks.append(np.asarray(inputs["kq_mask"], F32))
            return run(g, values, inputs, caches, trace)
        m.runner.run = capture
        s.trace = lambda ub, n, v: vals.__setitem__(n.id, np.array(v, copy=True))
        s.decode(7)
        weights = {}
        g = graphs[-1]
        out = []
        for n in g:
            if n.op is Op.MUL_MAT:                     # qwen3's attn_output is unnamed: the spec's value
                wn = g[n.inputs[0]]
                weights.setdefault(wn.name, np.array(m.weight(wn.name)))
                w, wtype, x = weights[wn.name], int(wn.params["ggml_type"]), vals[g[n.inputs[1]].inputs[0]]
                want = vals[n.id] if n.id in vals else quant.mul_mat(w, wtype, quant.quantize_act(x.reshape(1, -1)))
                out.append((n, (w, wtype, x), want))
            elif n.id not in vals and n.op is not Op.FLASH_ATTN:
                continue
            if n.op is Op.RMS_NORM:
                out.append((n, (vals[n.inputs[0]], n.params["eps"]), vals[n.id]))
            elif n.op is Op.FLASH_ATTN:
                reshape = next(r for r in g if r.op is Op.RESHAPE and r.inputs == (n.id,))
                q, k, v = (vals[i] for i in n.inputs[:3])
                out.append((n, (q, k, v, masks[-1][0], n.params["scale"]), vals[reshape.id]))
        in_graph = {op: sum(1 for n in g if n.op is op) for op in (Op.MUL_MAT, Op.RMS_NORM, Op.FLASH_ATTN)}
    return out, in_graph


@pytest.mark.parametrize("name", ["smollm2-q4_1", "smollm2-f16", "smollm2-q8_0", "smollm2-q2_0", "qwen3-small-q1_0",
                                  "qwen3-small-f16"])
def test_the_ops_of_a_decode_step_give_the_spec_bits(device_kern, name):
    kern = device_kern
    ops, in_graph = _decode_step_ops(name)
    counts = {Op.MUL_MAT: 0, Op.RMS_NORM: 0, Op.FLASH_ATTN: 0}
    for n, args, want in ops:
        if n.op is Op.MUL_MAT:
            w, wtype, x = args
            got = kern.matvec(w, wtype, quant.quantize_act(x.reshape(1, -1)))
        elif n.op is Op.RMS_NORM:
            x, eps = args
            got = kern.rmsnorm(x, None, eps)
        else:
            q, k, v, mask, scale = args
            got = kern.attention(q.reshape(q.shape[-2:]), k, v, mask, scale)
        assert _same(got.reshape(want.shape), want), (n.op, n.name, _diff(got, want))
        counts[n.op] += 1
    assert counts == in_graph and all(counts.values()), (counts, in_graph)     # every one of the step


# ---- the on-device check
def test_lavapipe_passes_the_portable_on_device_check(kern):
    from bankml.backends.spirv.portable import check as portable_check
    portable_check.check_device(kern)


def test_a_device_that_differs_in_one_bit_is_refused_in_one_line(device_kern):
    from bankml.backends.spirv.portable import check as portable_check

    class OffByOneUlp:
        d = device_kern.d

        def __getattr__(self, name):
            return getattr(device_kern, name)

        def softmax(self, x):
            y = device_kern.softmax(x)
            y.view(np.uint32)[0, 0] ^= 1
            return y
    with pytest.raises(runtime.DeviceRefused) as e:
        portable_check.check_device(OffByOneUlp())
    msg = str(e.value)
    assert "failed the portable on-device check: softmax edge rows: 1 of" in msg and "first at 0" in msg
    assert "staying on the CPU" in msg and "\n" not in msg


def test_activation_exponents_beyond_quantize_acts_are_refused(device_kern):
    from bankml.errors import BankmlError
    w = _q8_rows(np.ones((1, 8), np.float16), np.zeros((1, 256), np.int8))
    with pytest.raises(BankmlError, match="activation exponents -137..0 outside -136..118"):
        device_kern.matvec(w, Q8_0, _one_hot_act([8] * 8, [-137] + [0] * 7))


# ---- whole sessions with the kernels in place of the spec's ops
DEVICE_OPS = (Op.MUL_MAT, Op.RMS_NORM, Op.FLASH_ATTN, Op.SSM_CONV, Op.GATED_DELTA_NET, Op.QUANTIZE, Op.ROPE,
              Op.SET_ROWS)
PORTABLE_ORDERS = {Op.MUL_MAT: po.MUL_MAT, Op.RMS_NORM: po.RMS_NORM, Op.FLASH_ATTN: po.FLASH_ATTN,
                   Op.SSM_CONV: po.SSM_CONV, Op.GATED_DELTA_NET: po.GATED_DELTA_NET, Op.QUANTIZE: po.QUANTIZE,
                   Op.ROPE: po.ROPE, Op.SET_ROWS: po.SET_ROWS}
PER_BLOCK_ORDERS = {Op.MUL_MAT: po.MUL_MAT_BLOCKS, Op.FLASH_ATTN: po.FLASH_ATTN_BLOCKS,      # act_scaling PerBlock
                    Op.QUANTIZE: po.QUANTIZE_BLOCKS}


def _record(y) -> np.ndarray:
    """An op's output as one array to compare by bits: f32 values as they are, the bytes of
    activation blocks (codes, m, e, bad) and of cache rows as values."""
    if isinstance(y, quant.ActBlocks):
        return np.concatenate([np.frombuffer(np.ascontiguousarray(f).tobytes(), np.uint8) for f in y]).astype(F32)
    if y.dtype.names:
        return np.frombuffer(np.ascontiguousarray(y).tobytes(), np.uint8).astype(F32)
    return np.array(y, F32)


def _portable_key(op: Op, order=None) -> tuple:
    """The reference backend's table entry of op in the portable profile (its Sub32 order)."""
    return ("portable", op, order or PORTABLE_ORDERS[op])


def _spirv_lowerings(kern, calls: dict, outputs: list | None = None, flip: str | None = None) -> dict:
    """mul_mat, rms_norm, flash_attn, ssm_conv, gated_delta_net, quantize, rope and set_rows of the
    reference backend's portable table, run by the SPIR-V kernels (one dispatch each; the
    recurrent states and the cache rows written back in place, as the reference lowerings do).
    outputs: gets (op, node, value) of every call. flip: the first call of that op (or the
    logits' mul_mat, "logits") flips the low bit of its first value (a device one bit off)."""
    def done(g, n, y):
        calls[n.op] += 1
        if flip == n.op.value and calls[n.op] == 1 or flip == "logits" and n.id == g.outputs.get("logits"):
            y.reshape(-1).view(np.uint32)[0] ^= 1
        if outputs is not None:
            outputs.append((n.op, n.name or n.id, _record(y)))
        return y

    def mul_mat(env, g, n, w, a):
        wtype = int(g[n.inputs[0]].params["ggml_type"])
        dot = kern.mul_mat_blocks if n.order == po.MUL_MAT_BLOCKS else kern.mul_mat
        return done(g, n, dot(w, wtype, a).reshape(*n.shape[:-1], -1))

    def rms_norm(env, g, n, x):
        return done(g, n, kern.rmsnorm(x, None, n.params["eps"]))

    def flash_attn(env, g, n, q, k, v, mask):
        scaling = ActScaling.PER_BLOCK if n.order == po.FLASH_ATTN_BLOCKS else ActScaling.SUB32
        return done(g, n, kern.attention_rows(q, k, v, np.asarray(mask, F32), n.params["scale"], scaling))

    def ssm_conv(env, g, n, x, w, state):
        y, state[...] = kern.conv(x, w, state, silu=False)
        return done(g, n, y)

    def gated_delta_net(env, g, n, q, k, v, gate, beta, state):
        y, state[...] = kern.gated_delta_net(q, k, v, gate, beta, state, n.params["scale"])
        return done(g, n, y)
    def quantize(env, g, n, x):
        rows = x.reshape(-1, x.shape[-1])
        if n.order == po.QUANTIZE_BLOCKS:
            return done(g, n, SQ.quantize_blocks(kern, rows, n.params["block"]))
        return done(g, n, SQ.quantize_act(kern, rows))

    def rope(env, g, n, x, pos):
        p = n.params
        assert p["ext_factor"] == 0 and p["attn_factor"] == 1
        return done(g, n, rope_run(kern, x, pos, p["n_dims"], p["freq_base"], p["freq_scale"], p["mode"]))

    def set_rows(env, g, n, cache, values, pos):
        cache[pos] = SQ.cache_rows(kern, values)
        return done(g, n, cache[: n.shape[0]])
    fns = {Op.MUL_MAT: mul_mat, Op.RMS_NORM: rms_norm, Op.FLASH_ATTN: flash_attn, Op.SSM_CONV: ssm_conv,
           Op.GATED_DELTA_NET: gated_delta_net, Op.QUANTIZE: quantize, Op.ROPE: rope, Op.SET_ROWS: set_rows}
    return {**{_portable_key(op): fn for op, fn in fns.items()},
            **{_portable_key(op, order): fns[op] for op, order in PER_BLOCK_ORDERS.items()}}


@contextlib.contextmanager
def _kernels_in_place(kern, outputs: list | None = None, flip: str | None = None):
    """Inside, reference-backend runs of the portable profile lower DEVICE_OPS to the SPIR-V
    kernels. Yields {op: device dispatches} and {op: that op's nodes in
    the graphs run}: equal when every one of them ran on the device."""
    calls, in_graphs = dict.fromkeys(DEVICE_OPS, 0), dict.fromkeys(DEVICE_OPS, 0)
    run_graph = ref_run.run

    def counting_run(g, env, trace=None):
        for n in g:
            if n.op in in_graphs:
                in_graphs[n.op] += 1
        return run_graph(g, env, trace)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ref_run, "run", counting_run)
        for key, fn in _spirv_lowerings(kern, calls, outputs, flip).items():
            mp.setitem(LOWERINGS.entries, key, fn)
        yield calls, in_graphs


@contextlib.contextmanager
def _spec_outputs(outputs: list):
    """Inside, the reference backend's mul_mat, rms_norm and flash_attn (the numpy spec) append
    (op, node, value) of every call to outputs."""
    keys = [_portable_key(op) for op in DEVICE_OPS] + [_portable_key(op, o) for op, o in PER_BLOCK_ORDERS.items()]
    with pytest.MonkeyPatch.context() as mp:
        for key in keys:
            def recorded(env, g, n, *args, spec=LOWERINGS.entries[key]):
                y = spec(env, g, n, *args)
                outputs.append((n.op, n.name or n.id, _record(y)))
                return y
            mp.setitem(LOWERINGS.entries, key, recorded)
        yield outputs


def _first_op_differing(got: list, want: list) -> str | None:
    """The first device output whose bits are not the spec's output of the same call (the runs
    being the same graphs in the same order, each call's inputs are the spec's until then)."""
    assert [g[:2] for g in got] == [w[:2] for w in want], "not the same calls"
    for (op, node, g), (_, _, w) in zip(got, want):
        if not _same(g, w):
            return f"{op.value} {node}: {_diff(g, w)}"
    return None


def _all_on_device(calls: dict, in_graphs: dict) -> bool:
    """Every node of the device ops ran there; mul_mat, rms_norm, flash_attn, quantize, rope and
    set_rows in every model."""
    recurrent = (Op.SSM_CONV, Op.GATED_DELTA_NET)
    return calls == in_graphs and all(calls[op] for op in DEVICE_OPS if op not in recurrent)


def _load(name: str, n_ctx: int = 256, act_scaling: str = "Sub32"):
    return bankml.load(models.path(name), backend="reference", profile="portable", n_ctx=n_ctx,
                       act_scaling=act_scaling)


# model -> prompt tokens (as tests/runtime/test_portable_llvm.py; the 65-token prefill, and the
# prefill of 64, on the Qwen3 model: SmolLM2's 30 layers cost the numpy spec over a minute)
SESSION_MODELS = {"smollm2-q4_1": 9, "smollm2-f16": 9, "smollm2-q8_0": 9, "smollm2-q2_0": 9,
                  "qwen3-small-q1_0": 65, "qwen3-small-f16": 9, "qwen3-small-q2_0": 9,
                  "qwen3-small-untied-q1_0": 9, "qwen3-small-untied-f16": 9, "qwen3-small-untied-q2_0": 9,
                  "qwen35-small-q1_0": 65, "qwen35-small-f16": 9, "qwen35-small-q4_k_m": 9,
                  "smollm2-q5_1": 9, "PerBlock:smollm2-q4_1": 9, "PerBlock:qwen3-small-q1_0": 9,
                  "PerBlock:qwen35-small-q4_k_m": 9}
CUTS = ((1, "all"), (7, "last"), (64, "last"))     # prefills of the first tokens, then a decode


@pytest.mark.parametrize("name", list(SESSION_MODELS))
def test_logits_rows_with_the_spirv_kernels_equal_the_specs(device_kern, name):
    """Every mul_mat, rms_norm, flash_attn, quantize, rope and K/V cache write (set_rows), and a
    Qwen3.5's ssm_conv and gated_delta_net, on lavapipe, Sub32 and ("PerBlock:" models) act_scaling PerBlock, every weight format (Q4_K_M's
    Q4_K, Q6_K and Q5_0; Q5_1): the prefill of the whole prompt gives
    every op's output and every row of the reference's prefill bit for bit; prefills of its
    first 1, 7 and 64 tokens (all rows, or the last), each followed by a decode, give the same
    rows (a portable row does not depend on the cut: tests/runtime/test_portable_model.py)."""
    n = SESSION_MODELS[name]
    scaling, _, model = name.rpartition(":")
    load = lambda: _load(model, act_scaling=scaling or "Sub32")          # noqa: E731
    toks = np.random.default_rng(3).integers(0, 49152, n).tolist()
    with _spec_outputs([]) as spec_ops, load() as m:
        want = m.session().prefill(toks, outputs="all")
    device_ops = []
    with _kernels_in_place(device_kern, device_ops) as (calls, in_graphs), load() as m:
        got = m.session().prefill(toks, outputs="all")
        assert _first_op_differing(device_ops, spec_ops) is None, _first_op_differing(device_ops, spec_ops)
        assert _same(got, want), f"prefill of {n}: {_diff(got, want)}"
        device_ops.clear()
        for cut, outputs in (c for c in CUTS if c[0] < n):
            s = m.session()
            rows = s.prefill(toks[:cut], outputs=outputs)
            first = 0 if outputs == "all" else cut - 1
            assert _same(rows, want[first:cut]), f"prefill of {cut} ({outputs}): {_diff(rows, want[first:cut])}"
            row = s.decode(toks[cut])
            assert _same(row, want[cut]), f"decode after {cut}: {_diff(row, want[cut])}"
    assert _all_on_device(calls, in_graphs), (calls, in_graphs)
    assert bool(calls[Op.GATED_DELTA_NET] and calls[Op.SSM_CONV]) == model.startswith("qwen35"), calls


@pytest.mark.parametrize("flip", ["logits", "mul_mat", "rms_norm", "flash_attn"])
def test_a_device_output_one_bit_off_fails_the_comparison(device_kern, flip):
    """One device output one bit off: the logits row shows it; in a layer, the next activation
    quantization may absorb it (the rows stay the spec's), the comparison of every op does not."""
    toks = [5, 900, 17]
    with _spec_outputs([]) as spec_ops, _load("qwen3-small-q1_0") as m:
        want = m.session().prefill(toks, outputs="all")
    device_ops = []
    with _kernels_in_place(device_kern, device_ops, flip), _load("qwen3-small-q1_0") as m:
        got = m.session().prefill(toks, outputs="all")
    first = _first_op_differing(device_ops, spec_ops)
    if flip == "logits":
        assert first.startswith("mul_mat result_output: 1 differ, first [0]")
        assert (got.view(np.uint32) != want.view(np.uint32)).sum() == 1 and got[0, 0] != want[0, 0]
    else:
        assert first.startswith(f"{flip} ") and ": 1 differ, first [0]" in first, first


# decode steps at these (first position, steps): the 1,024th cell (n_kv 1,024), the 1,025th
# (n_kv 1,280) and the 1,100th
LONG_STEPS = ((1023, 2), (1099, 1))


def _decode_steps(name: str, cache: dict, toks: list[int]) -> np.ndarray:
    """Rows of single-token decodes at LONG_STEPS' positions on the reference backend, its cache
    the given cells."""
    rows = []
    with _load(name, 1280) as m:
        s = m.session()
        for key, c in s.caches.items():
            c[:] = cache[key]
        for first, steps in LONG_STEPS:
            s.restore(first)
            rows += [s.decode(t) for t in toks[first:first + steps]]
    return np.array(rows)


@pytest.mark.parametrize("name", ["smollm2-q4_1", "qwen3-small-q1_0"])
def test_decodes_past_1024_cells_with_the_spirv_kernels_equal_the_spec_and_llvm(device_kern, name):
    """The attention over a cache past 1,024 cells (n_kv 1,280) up to the 1,100th cell: llvm
    fills the cache (1,100 tokens: the numpy spec would take minutes) and gives its rows of
    decodes at those positions; the reference backend's decodes there from llvm's cells, with
    the numpy spec and with the SPIR-V kernels, give the same bits. Both head shapes
    (SmolLM2 9/3 x 64, Qwen3 4/2 x 128)."""
    toks = np.random.default_rng(4).integers(0, 49152, 1100).tolist()
    llvm_rows = []
    with bankml.load(models.path(name), backend="llvm", threads=2, profile="portable", n_ctx=1280) as m:
        s = m.session()
        at = 0
        for first, steps in LONG_STEPS:
            s.prefill(toks[at:first], outputs="last")
            llvm_rows += [s.decode(t) for t in toks[first:first + steps]]
            at = first + steps
        assert s.n_past == 1100
        cache = {key: c.copy() for key, c in s.caches.items()}
    with _spec_outputs([]) as spec_ops:
        want = _decode_steps(name, cache, toks)
    assert _same(want, np.array(llvm_rows)), _diff(want, np.array(llvm_rows))
    device_ops = []
    with _kernels_in_place(device_kern, device_ops) as (calls, in_graphs):
        got = _decode_steps(name, cache, toks)
    assert _first_op_differing(device_ops, spec_ops) is None, _first_op_differing(device_ops, spec_ops)
    assert _same(got, want), _diff(got, want)
    assert _all_on_device(calls, in_graphs), (calls, in_graphs)


# ---- Qwen3.5's recurrence
@pytest.mark.parametrize("silu", [True, False], ids=["conv", "conv_sum"])
@pytest.mark.parametrize("T,ch,taps", [(5, 70, 4), (1, 9, 4), (2, 3, 2)])
def test_conv_token_by_token_over_the_ring(kern, silu, T, ch, taps):
    from bankml.profiles.portable import gdn
    rng = np.random.default_rng(T * ch + taps)
    x = (rng.standard_normal((T, ch)) * 4).astype(F32)
    x[0, :3] = [np.nan, np.inf, 1e-40]
    w, state = rng.standard_normal((ch, taps)).astype(F32), rng.standard_normal((ch, taps - 1)).astype(F32)
    got, got_state = kern.conv(x, w, state, silu)
    ring, want = arith.canon(state.T), []
    with np.errstate(all="ignore"):
        for t in range(T):
            want.append((gdn.conv if silu else gdn.conv_sum)(ring, x[t], w))
            ring = np.concatenate([ring[1:], arith.canon(x[t])[None]])
    assert _same(got, np.stack(want)), _diff(got, np.stack(want))
    assert _same(got_state, ring.T), _diff(got_state, ring.T)


@pytest.mark.parametrize("T,Hk,Hv,S", [(3, 2, 4, 16), (1, 4, 8, 32), (2, 1, 3, 12)])
def test_gated_delta_net_is_gdn_row_per_token_head_and_row(kern, T, Hk, Hv, S):
    from bankml.backends.reference import portable as reference
    from bankml.ir.node import Node
    rng = np.random.default_rng(T + Hv + S)
    q, k = (rng.standard_normal((T, Hk, S)).astype(F32) * F32(0.3) for _ in range(2))
    v = rng.standard_normal((T, Hv, S)).astype(F32)
    v[0, 0, :2] = [np.nan, np.inf]
    g = (-np.abs(rng.standard_normal((T, Hv))) * 2).astype(F32)
    g[0, -1] = -200.0
    beta = rng.uniform(0, 1, (T, Hv)).astype(F32)
    state = (rng.standard_normal((Hv, S, S)) * 0.2).astype(F32)
    scale = float(F32(1) / np.sqrt(F32(S)))
    want_state = state.copy()
    n = Node(0, Op.GATED_DELTA_NET, (), (T, Hv, S), "f32", None, po.GATED_DELTA_NET, {"scale": scale})
    with np.errstate(all="ignore"):
        want = reference._gated_delta_net(None, None, n, q, k, v, g, beta, want_state)
    got, got_state = kern.gated_delta_net(q, k, v, g, beta, state, scale)
    assert _same(got, want), _diff(got, want)
    assert _same(got_state, want_state), _diff(got_state, want_state)


def _log(rng, n, s_k, s_v):
    from bankml.profiles.portable import gdn
    return [gdn.Logged(rng.standard_normal(s_k).astype(F32) * F32(0.25), rng.standard_normal(s_v).astype(F32),
                       F32(-abs(rng.standard_normal()) * 0.3), F32(rng.uniform(0.05, 0.9))) for _ in range(n)]


@pytest.mark.parametrize("L,s_k,s_v", [(5, 16, 8), (1, 12, 3), (9, 32, 32)])
def test_lazily_flushed_head_flush_fold_and_read(kern, L, s_k, s_v):
    """gdn_flush (every row), gdn_fold and gdn_fold_trailing (every split of the log) and
    gdn_read on the device: the numpy spec's bits."""
    from bankml.profiles.portable import gdn
    rng = np.random.default_rng(L * s_k + s_v)
    log = _log(rng, L, s_k, s_v)
    log[0] = gdn.Logged(log[0].key, log[0].values, F32(-200.0), log[0].beta)      # a decay of 0
    rows = rng.standard_normal((s_v, s_k)).astype(F32)
    want = rows.copy()
    for r in range(s_v):
        gdn.gdn_flush(want[r], log, r)
    got = kern.gdn_flush(rows, log)
    assert _same(got, want), _diff(got, want)
    q = rng.standard_normal(s_k).astype(F32)
    width = max(1, s_v - 1)
    for older in range(L + 1):
        (yn, cn), (yw, cw) = kern.gdn_fold_trailing(log, q, width, older)
        (wyn, wcn), (wyw, wcw) = gdn.gdn_fold_trailing(log, q, width, older)
        for g_, w_ in ((yn, wyn), (cn, wcn), (yw, wyw), (cw, wcw)):
            assert _same(g_, w_), (older, _diff(g_, w_))
    y, carried = gdn.gdn_fold(log, q, s_v)
    gy, gc = kern.gdn_fold(log, q, s_v)
    assert _same(gy, y) and _same(gc, carried)
    want_read = np.array([gdn.gdn_read(rows[r], y, carried[r], F32(0.125)) for r in range(s_v)])
    got_read = kern.gdn_read(rows, y, carried, 0.125)
    assert _same(got_read, want_read), _diff(got_read, want_read)
