"""The portable SPIR-V matvec of the coded block formats (Q4_0, Q5_0, Q5_1, Q4_K, Q6_K) equals
coded.dot_sub32 bit for bit (Sub32), and the PerBlock matvec of every block format equals
coded.dot_blocks: random rows (a last short group of 256 where the block allows one), activation
rows with zero, denormal, NaN and infinite blocks, exponents over their whole range, and real
tensors of the test models; on the device and as a denormal-flushing device would run them."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.spirv import builder as B
from bankml.backends.spirv.portable import kernels as PK
from bankml.gguf.reader import read_gguf
from bankml.profiles.portable import coded, quant
from bankml.quants import Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, Q8_0, WEIGHT_TYPES
from bankml.testing import models
from tests.backends.spirv.test_portable_vulkan import kern  # noqa: F401 (the device fixture)

F32 = np.float32
CODED = {"Q4_0": Q4_0, "Q5_0": Q5_0, "Q5_1": Q5_1, "Q4_K": Q4_K, "Q6_K": Q6_K}
KS = {Q4_0: (64, 576), Q5_0: (64, 576), Q5_1: (64, 576), Q4_K: (256, 512), Q6_K: (256, 512)}
# the f16 scales of a block: byte offsets (d, and the min or dmin)
SCALES = {Q8_0: (0,), Q4_1: (0, 2), Q1_0: (0,), Q2_0: (0,), Q4_0: (0,), Q5_0: (0,), Q5_1: (0, 2),
          Q4_K: (0, 2), Q6_K: (208,)}


def _bits_equal(got, want) -> None:
    got, want = np.asarray(got, F32), np.asarray(want, F32)
    assert got.shape == want.shape
    bad = np.flatnonzero(got.view(np.uint32).ravel() != want.view(np.uint32).ravel())
    assert bad.size == 0, f"{bad.size} differ, first {bad[:5]}: {got.ravel()[bad[:5]]} vs {want.ravel()[bad[:5]]}"


def _rand_rows(rng, wtype: int, rows: int, k: int, scale: float = 0.02) -> np.ndarray:
    """Random bytes as rows of a block format, its f16 scales finite (normal, some subnormal)."""
    wt = WEIGHT_TYPES[wtype]
    r = rng.integers(0, 256, (rows, k // wt.block, wt.block_bytes), dtype=np.uint8)
    for off in SCALES[wtype]:
        h = (rng.standard_normal(r.shape[:2]) * scale).astype(np.float16)
        h[rng.random(h.shape) < 0.05] = np.float16(2 ** -20)                    # a subnormal scale
        r[:, :, off:off + 2] = h.view(np.uint8).reshape(rows, -1, 2)
    return r.reshape(rows, -1)


def _act_rows(rng, k: int) -> np.ndarray:
    """Activation rows: plain, then with zero blocks (the second half), denormals, a NaN and an
    infinity (bad blocks), huge and tiny values."""
    x = rng.standard_normal((6, k)).astype(F32) * F32(3)
    x[1, k // 2:] = 0.0
    x[2, 5:9] = [1e-40, -1e-45, 3e-39, 0.0]
    x[3, k - 3] = np.nan
    x[4, 40 % k] = -np.inf
    x[5, :k // 2] *= F32(1e30)
    x[5, k // 2:] *= F32(1e-30)
    return x


@pytest.mark.parametrize("tname", list(CODED))
def test_coded_matvec_random_rows_equal_dot_sub32(kern, tname):
    wtype = CODED[tname]
    for k in KS[wtype]:
        rng = np.random.default_rng(100 * wtype + k)
        w = _rand_rows(rng, wtype, 70, k)
        a = quant.quantize_act(_act_rows(rng, k))
        _bits_equal(kern.mul_mat(w, wtype, a), coded.dot_sub32(w, wtype, a))
        assert np.isnan(kern.mul_mat(w, wtype, a)[3:5]).all()


@pytest.mark.parametrize("tname", list(CODED))
def test_coded_matvec_wide_spread_of_exponents(kern, tname):
    """Activation blocks whose exponents span the whole range quantize_act gives (-136..118):
    the wide sums, with the second scale's terms (Q5_1, Q4_K) beside them."""
    wtype = CODED[tname]
    k = KS[wtype][1]
    rng = np.random.default_rng(7 + wtype)
    w = _rand_rows(rng, wtype, 64, k, scale=1.0)
    nb = k // 32
    m = rng.integers(8, 16, (2, nb)).astype(np.int64)
    m[rng.random((2, nb)) < 0.2] = 0
    e = np.where(m == 0, 0, rng.integers(-136, 119, (2, nb))).astype(np.int64)
    q = rng.integers(-127, 128, (2, k)).astype(np.int8)
    q.reshape(2, nb, 32)[m == 0] = 0
    a = quant.ActBlocks(q, m, e, np.zeros((2, nb), bool))
    _bits_equal(kern.mul_mat(w, wtype, a), coded.dot_sub32(w, wtype, a))


@pytest.fixture(scope="module")
def ggufs():
    return {name: read_gguf(models.path(name)) for name in
            ("llama-kq-q4_k_m", "qwen35-small-q4_k_m", "smollm2-q4_0", "smollm2-q5_0", "smollm2-q5_1")}


def _tensor(gg, name: str, rows: int) -> tuple[np.ndarray, int, int]:
    t = gg.tensors[name]
    w = gg.tensor_data(name).reshape(int(np.prod(t.shape[1:])), -1)
    return w[:rows], t.ggml_type, t.shape[0]


REAL = [("llama-kq-q4_k_m", "blk.0.ffn_gate.weight", Q4_K), ("llama-kq-q4_k_m", "output.weight", Q6_K),
        ("qwen35-small-q4_k_m", "blk.3.attn_output.weight", Q5_0), ("smollm2-q4_0", "blk.0.attn_q.weight", Q4_0),
        ("smollm2-q5_0", "blk.0.attn_q.weight", Q5_0), ("smollm2-q5_1", "blk.0.attn_q.weight", Q5_1)]


@pytest.mark.parametrize("model,tensor,wtype", REAL)
def test_coded_matvec_real_model_rows(kern, ggufs, model, tensor, wtype):
    w, ty, k = _tensor(ggufs[model], tensor, 96)
    assert ty == wtype
    a = quant.quantize_act(np.random.default_rng(k).standard_normal((2, k)).astype(F32))
    _bits_equal(kern.mul_mat(w, wtype, a), coded.dot_sub32(w, wtype, a))


# ---- PerBlock: activations quantized per the weight's own block (coded.dot_blocks)
BLOCKS = {"Q8_0": Q8_0, "Q4_1": Q4_1, "Q1_0": Q1_0, "Q2_0": Q2_0} | CODED


def _ks_blocks(wtype: int) -> tuple[int, int]:
    """One block, then several (not a multiple of 256 where the block allows it)."""
    b = WEIGHT_TYPES[wtype].block
    return b, {32: 576, 64: 576, 128: 640, 256: 512}[b]


MODULES = [(PK.emit_matvec, t) for t in CODED] + [(PK.emit_matvec_blocks, t) for t in BLOCKS]


@pytest.mark.parametrize("emit,tname", MODULES, ids=[f"{e.__name__}-{t}" for e, t in MODULES])
def test_modules_pass_spirv_val(emit, tname):
    B.validate(list(emit(BLOCKS[tname])))


@pytest.mark.parametrize("tname", list(BLOCKS))
def test_blocks_matvec_random_rows_equal_dot_blocks(kern, tname):
    wtype = BLOCKS[tname]
    for k in _ks_blocks(wtype):
        rng = np.random.default_rng(1000 + 100 * wtype + k)
        w = _rand_rows(rng, wtype, 70, k)
        a = quant.quantize_blocks(_act_rows(rng, k), coded.block_of(wtype))
        got = kern.mul_mat_blocks(w, wtype, a)
        _bits_equal(got, coded.dot_blocks(w, wtype, a))
        assert np.isnan(got[3:5]).all()


@pytest.mark.parametrize("tname", list(BLOCKS))
def test_blocks_matvec_wide_spread_of_exponents(kern, tname):
    """Activation blocks (m in 128..255) at exponents over the whole range quantize_blocks gives
    (-163..114), weights of large and subnormal scales: the blocks' adds overflow and flush."""
    wtype = BLOCKS[tname]
    k = _ks_blocks(wtype)[1]
    rng = np.random.default_rng(17 + wtype)
    w = _rand_rows(rng, wtype, 64, k, scale=1.0)
    nb = k // coded.block_of(wtype)
    m = rng.integers(128, 256, (3, nb)).astype(np.int64)
    m[rng.random((3, nb)) < 0.2] = 0
    e = np.where(m == 0, 0, rng.integers(-163, 115, (3, nb))).astype(np.int64)
    q = rng.integers(-127, 128, (3, k)).astype(np.int8)
    q.reshape(3, nb, -1)[m == 0] = 0
    a = quant.ActBlocks(q, m, e, np.zeros((3, nb), bool))
    _bits_equal(kern.mul_mat_blocks(w, wtype, a), coded.dot_blocks(w, wtype, a))


@pytest.mark.parametrize("model,tensor,wtype", REAL)
def test_blocks_matvec_real_model_rows(kern, ggufs, model, tensor, wtype):
    w, _, k = _tensor(ggufs[model], tensor, 96)
    x = np.random.default_rng(k + 1).standard_normal((2, k)).astype(F32)
    a = quant.quantize_blocks(x, coded.block_of(wtype))
    _bits_equal(kern.mul_mat_blocks(w, wtype, a), coded.dot_blocks(w, wtype, a))


@pytest.mark.parametrize("H,Hkv,D,M,n_kv", [(9, 3, 64, 3, 256), (4, 2, 128, 5, 96)])
def test_attention_with_a_per_block_query(kern, H, Hkv, D, M, n_kv):
    """PerBlock's attention (each query head one block of wide scale, m in 128..255) equals
    attention.attention(..., PER_BLOCK): causal rows, a NaN in one head, heads far apart in size."""
    from bankml.profiles.portable import attention as A
    rng = np.random.default_rng(M + D)
    q = (rng.standard_normal((M, H, D)) * 3).astype(np.float32)
    q[M // 2, 1, 5] = np.nan
    q[0, 0] *= np.float32(2.0 ** 40)
    q[-1, -1, :32] *= np.float32(2.0 ** -30)
    k = A.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(np.float32))
    v = A.cache_row(rng.standard_normal((n_kv, Hkv, D)).astype(np.float32))
    visible = np.arange(n_kv)[None, :] <= np.arange(n_kv - M, n_kv)[:, None]
    mask = np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    pb = quant.ActScaling.PER_BLOCK
    got, want = kern.attention_rows(q, k, v, mask, 0.125, pb), A.attention(q, k, v, mask, 0.125, pb)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert not np.array_equal(want, A.attention(q, k, v, mask, 0.125))          # not Sub32's
