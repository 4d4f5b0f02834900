"""The llvm kernels of the portable profile for Qwen3.5's ops (backends/llvm/portable/recurrent.py,
L2_NORM and the partial ROPE in ops.py) and a lazily flushed head's functions
(backends/llvm/portable/lazy.py) give the numpy spec's bits (the reference backend's lowerings)
for 1, 2 and 3 threads, tails and specials included. The ln, ln1p and softplus emitters are
tested with the others in test_llvm_portable_ops.py."""
from __future__ import annotations

import numpy as np
import pytest

from bankml.backends.reference import portable as reference
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.profiles.portable import funcs, orders as po, rotary
from tests.backends.llvm.llvm_kernel_util import compile_kernel, run_kernel
from tests.backends.llvm.test_llvm_portable_ops import EPS, ROPE_PARAMS, _inp, _pgraph, _run_all_nth, _same, _values

F32 = np.float32


@pytest.mark.parametrize("op,order,spec", [(Op.SILU, po.SILU, funcs.silu), (Op.SIGMOID, po.SIGMOID, funcs.sigmoid),
                                           (Op.SOFTPLUS, po.SOFTPLUS, funcs.softplus)],
                         ids=["silu", "sigmoid", "softplus"])
@pytest.mark.parametrize("shape", [(7, 64), (3, 13), (1, 5)], ids=str)           # 8 lanes; a tail; a tail alone
def test_unary_kernels_bits_equal_spec(op, order, spec, shape):
    g = _pgraph(_inp(0, shape))
    n = g.add(Node(1, op, (0,), shape, "f32", "x", order))
    x = _values(int(np.prod(shape)), sum(shape), 12.0).reshape(shape)
    with np.errstate(all="ignore"):
        want = spec(x)
    for nth, out in _run_all_nth(g, n, shape, F32, [x]):
        _same(out, want, f"nth={nth}")


@pytest.mark.parametrize("shape", [(5, 4, 32), (3, 8, 128), (2, 3, 12)], ids=str)
def test_l2_norm_bits_equal_spec(shape):
    g = _pgraph(_inp(0, shape))
    n = g.add(Node(1, Op.L2_NORM, (0,), shape, "f32", "q_conv_predelta-0", po.L2_NORM, {"eps": EPS}))
    x = _values(int(np.prod(shape)), 9).reshape(shape)
    x[0, 0] = np.abs(x[0, 0]) * F32(1e-21)             # a sum of squares below eps
    with np.errstate(all="ignore"):
        want = funcs.l2norm(x, EPS)
    for nth, out in _run_all_nth(g, n, shape, F32, [x]):
        _same(out, want, f"nth={nth}")


@pytest.mark.parametrize("mode,heads,hd,nd", [("neox", 3, 64, 16), ("neox", 2, 256, 64), ("norm", 2, 64, 20)],
                         ids=str)                       # 8 lanes, 8 lanes, one pair at a time
def test_partial_rope_rotates_the_first_n_dims_and_keeps_the_rest(mode, heads, hd, nd):
    pos = np.array([0, 1, 7, 255, 1099, 65535], np.int32)
    T = len(pos)
    g = _pgraph(_inp(0, (T, heads, hd)), _inp(1, (T,), "i32"))
    params = {**ROPE_PARAMS, "mode": mode, "n_dims": nd, "freq_base": 1e7, "freq_scale": 1.0}
    n = g.add(Node(2, Op.ROPE, (0, 1), (T, heads, hd), "f32", "Qcur-3", po.ROPE, params))
    x = _values(T * heads * hd, nd).reshape(T, heads, hd)
    with np.errstate(all="ignore"):
        want = reference._rope(None, g, n, x, pos)
        cos, sin = rotary.rope_table(pos, nd, 1e7, 1.0)
        assert np.array_equal(want[..., :nd].view(np.uint32), rotary.rope(x[..., :nd], cos, sin, mode).view(np.uint32))
    for nth, out in _run_all_nth(g, n, x.shape, F32, [x, pos]):
        _same(out, want, f"nth={nth}")


@pytest.mark.parametrize("T,ch,taps", [(5, 21, 4), (1, 16, 4), (2, 9, 3), (7, 40, 2)], ids=str)
def test_ssm_conv_bits_and_state_equal_spec(T, ch, taps):
    """8 channels at a time and the rest one by one; fewer tokens than the state's columns; the
    state left holding the last taps - 1 columns."""
    g = _pgraph(_inp(0, (T, ch)), Node(1, Op.WEIGHT, (), (ch, taps), "F32"),
                Node(2, Op.CACHE, (), (ch, taps - 1), "f32", params={"layer": 0, "kind": "conv"}))
    n = g.add(Node(3, Op.SSM_CONV, (0, 1, 2), (T, ch), "f32", "conv_output_raw-0", po.SSM_CONV))
    x, w = _values(T * ch, 1).reshape(T, ch), _values(ch * taps, 2).reshape(ch, taps)
    state0 = _values(ch * (taps - 1), 3).reshape(ch, taps - 1)
    want_state = state0.copy()
    with np.errstate(all="ignore"):
        want = reference._ssm_conv(None, g, n, x, w, want_state)
    kern = compile_kernel(g, n)
    for nth in (1, 2, 3):
        state = state0.copy()
        out = run_kernel(g, n, np.full((T, ch), np.nan, F32), [x, w, state], nth, kernel=kern)
        _same(out, want, f"nth={nth}")
        _same(state, want_state, f"state nth={nth}")


@pytest.mark.parametrize("T,hk,hv,S", [(3, 2, 4, 16), (1, 4, 8, 32), (2, 1, 3, 8)], ids=str)
def test_gated_delta_net_bits_and_state_equal_spec(T, hk, hv, S):
    rng = np.random.default_rng(S + T)
    q, k = (rng.standard_normal((T, hk, S)).astype(F32) * F32(0.3) for _ in range(2))
    v = _values(T * hv * S, 4).reshape(T, hv, S)
    gate = (-np.abs(rng.standard_normal((T, hv))) * 2).astype(F32)
    gate[0, 0] = -200.0                                 # exp's clamp: a decay of 0
    beta = rng.uniform(0, 1, (T, hv)).astype(F32)
    state0 = (rng.standard_normal((hv, S, S)) * 0.2).astype(F32)
    scale = float(F32(1) / np.sqrt(F32(S)))
    g = _pgraph(_inp(0, (T, hk, S)), _inp(1, (T, hk, S)), _inp(2, (T, hv, S)), _inp(3, (T, hv)), _inp(4, (T, hv)),
                Node(5, Op.CACHE, (), (hv, S, S), "f32", params={"layer": 0, "kind": "ssm"}))
    n = g.add(Node(6, Op.GATED_DELTA_NET, (0, 1, 2, 3, 4, 5), (T, hv, S), "f32", "attn_output-0",
                   po.GATED_DELTA_NET, {"scale": scale}))
    want_state = state0.copy()
    with np.errstate(all="ignore"):
        want = reference._gated_delta_net(None, g, n, q, k, v, gate, beta, want_state)
    kern = compile_kernel(g, n)
    for nth in (1, 2, 3):
        state = state0.copy()
        out = run_kernel(g, n, np.full((T, hv, S), np.nan, F32), [q, k, v, gate, beta, state], nth, kernel=kern)
        _same(out, want, f"nth={nth}")
        _same(state, want_state, f"state nth={nth}")


@pytest.fixture(scope="module")
def heads():
    from bankml.backends.llvm.portable.lazy import LazyHeads
    return LazyHeads()


@pytest.mark.parametrize("L,s_k,s_v", [(5, 16, 8), (1, 12, 3), (9, 37, 32)])      # 37: an 8-lane tail
def test_lazily_flushed_head_flush_fold_and_read(heads, L, s_k, s_v):
    """gdn_flush (every row; 1, 2 and 3 threads), gdn_fold and gdn_fold_trailing (every split of
    the log) and gdn_read: the numpy spec's bits."""
    from bankml.profiles.portable import gdn
    rng = np.random.default_rng(L * s_k + s_v)
    log = [gdn.Logged(rng.standard_normal(s_k).astype(F32) * F32(0.25), rng.standard_normal(s_v).astype(F32),
                      F32(-abs(rng.standard_normal()) * 0.3), F32(rng.uniform(0.05, 0.9))) for _ in range(L)]
    log[0] = gdn.Logged(log[0].key, log[0].values, F32(-200.0), log[0].beta)      # a decay of 0
    rows = rng.standard_normal((s_v, s_k)).astype(F32)
    want = rows.copy()
    for r in range(s_v):
        gdn.gdn_flush(want[r], log, r)
    for nth in (1, 2, 3):
        _same(heads.gdn_flush(rows, log, nth), want, f"flush nth={nth}")
    q = rng.standard_normal(s_k).astype(F32)
    width = max(1, s_v - 1)
    for older in range(L + 1):
        got, spec = heads.gdn_fold_trailing(log, q, width, older), gdn.gdn_fold_trailing(log, q, width, older)
        for g_, w_ in zip((*got[0], *got[1]), (*spec[0], *spec[1])):
            _same(g_, w_, f"fold older={older}")
    y, carried = gdn.gdn_fold(log, q, s_v)
    for g_, w_ in zip(heads.gdn_fold(log, q, s_v), (y, carried)):
        _same(g_, w_, "fold")
    want_read = np.array([gdn.gdn_read(rows[r], y, carried[r], F32(0.125)) for r in range(s_v)])
    _same(heads.gdn_read(rows, y, carried, 0.125), want_read, "read")


def test_a_lazy_head_call_that_does_not_fit_is_one_line(heads):
    from bankml.errors import BankmlError
    from bankml.profiles.portable import gdn
    tok = gdn.Logged(np.zeros(8, F32), np.zeros(4, F32), F32(0), F32(0.5))
    with pytest.raises(BankmlError, match="lazy head: a log of 0 tokens"):
        heads.gdn_flush(np.zeros((4, 8), F32), [])
    with pytest.raises(BankmlError, match="does not fit keys of 16"):
        heads.gdn_flush(np.zeros((4, 16), F32), [tok])
    with pytest.raises(BankmlError, match="2 older"):
        heads.gdn_fold_trailing([tok], np.zeros(8, F32), 4, 2)
    with pytest.raises(BankmlError, match="lazy head: a read of rows"):
        heads.gdn_read(np.zeros((4, 8), F32), np.zeros(8, F32), np.zeros(3, F32), 1.0)
