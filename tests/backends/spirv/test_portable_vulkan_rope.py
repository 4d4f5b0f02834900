"""The portable RoPE as a SPIR-V kernel on Vulkan (lavapipe in CI) equals the reference lowering
of Op.ROPE (rotary.rope_table + rotary.rope, the dims past n_dims copied) bit for bit: modes norm and
neox, head dims 64 and 128, partial ropes, positions 0, 1, up to 2^17 - 1 and random, freq_base
10000 and 1e6, freq_scale 1 and 0.25 (and a tiny one: t_i of small exponents, some flushed to 0),
x with NaN, inf, denormals and huge values; on the device and as the worst denormal-flushing
device (`flushing`)."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from bankml.backends.reference import portable as ref_portable
from bankml.backends.spirv import builder as B
from bankml.backends.spirv.portable import rope as R
from tests.backends.spirv.test_portable_vulkan import _diff, _same, kern  # noqa: F401 (kern: the device fixture)

F32 = np.float32
TOP = (1 << 17) - 1


def _reference(x, pos, n_dims, freq_base, freq_scale, mode):
    """The graph's lowering itself (bankml/backends/reference/portable.py, Op.ROPE)."""
    n = SimpleNamespace(params={"n_dims": n_dims, "freq_base": freq_base, "freq_scale": freq_scale, "mode": mode,
                                "ext_factor": 0.0, "attn_factor": 1.0}, name="rope", id=0)
    return ref_portable._rope(None, None, n, x, np.asarray(pos, np.int32))


def _positions(rng, T):
    p = np.concatenate([[0, 1, 2, TOP, TOP - 1, 1 << 16, 4095], rng.integers(0, 1 << 17, max(T - 7, 0))])
    return p[:T].astype(np.int32)


def _specials(rng, shape) -> np.ndarray:
    """Random values with NaNs, +-inf, denormals, +-0 and huge ones scattered in."""
    x = (rng.standard_normal(shape) * 3).astype(F32)
    b = x.view(np.uint32).ravel()
    pick = rng.integers(0, 10, b.size)
    specials = np.array([0x7FC00000, 0xFFC00001, 0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF,
                         0x00000000, 0x80000000, 0x7F7FFFFF, 0xFF000000], np.uint32)
    b[pick == 0] = specials[rng.integers(0, specials.size, int((pick == 0).sum()))]
    return x


def test_module_passes_spirv_val_and_no_float_op_may_contract():
    for flushing in (False, True):
        words = list(R.emit_rope(flushing))
        B.validate(words)
        text = B.disassemble(words)
        float_ops = set(re.findall(r"^\s*(%\S+) = Op(?:FAdd|FSub|FMul) ", text, re.M))
        assert float_ops and float_ops <= set(re.findall(r"OpDecorate (%\S+) NoContraction", text))
        assert "OpExtInst" not in text and "Fma" not in text and "Float64" not in text and "OpFDiv" not in text


@pytest.mark.parametrize("mode", ["norm", "neox"])
@pytest.mark.parametrize("D,n_dims", [(64, 64), (128, 128), (128, 32), (64, 16)],
                         ids=["d64", "d128", "d128-partial32", "d64-partial16"])
@pytest.mark.parametrize("freq_base,freq_scale", [(10000.0, 1.0), (1e6, 0.25)], ids=["1e4x1", "1e6x0.25"])
def test_rope_equals_reference(kern, mode, D, n_dims, freq_base, freq_scale):  # noqa: F811
    rng = np.random.default_rng(D * 7 + n_dims + int(freq_base) % 97 + (mode == "neox"))
    T, H = 24, 3
    x = _specials(rng, (T, H, D))
    pos = _positions(rng, T)
    got = R.rope_run(kern, x, pos, n_dims, freq_base, freq_scale, mode)
    want = _reference(x, pos, n_dims, freq_base, freq_scale, mode)
    assert _same(got, want), _diff(got, want)


@pytest.mark.parametrize("freq_base,freq_scale", [(10000.0, 1.0), (1e6, 0.25), (1e6, 1e-33)],
                         ids=["1e4x1", "1e6x0.25", "tiny-scale"])
def test_rope_table_over_many_positions(kern, freq_base, freq_scale):  # noqa: F811
    """cos/sin themselves (x = e_0 pair-wise, norm: y = (cos, sin)) at 2048 positions spanning 0 ..
    2^17 - 1; a freq_scale of 1e-33 puts t_i at 2^-112 and below (the last ones flushed to 0), the
    whole product p·t_i the fraction d, of small exponents."""
    rng = np.random.default_rng(5)
    T, D = 2048, 128
    pos = np.concatenate([np.arange(16), TOP - np.arange(16), rng.integers(0, 1 << 17, T - 32)]).astype(np.int32)
    x = np.zeros((T, 1, D), F32)
    x[..., 0::2] = 1.0
    got = R.rope_run(kern, x, pos, D, freq_base, freq_scale, "norm")
    want = _reference(x, pos, D, freq_base, freq_scale, "norm")
    assert _same(got, want), _diff(got, want)


def test_rope_rejects_bad_arguments(kern):  # noqa: F811
    x = np.zeros((2, 1, 8), F32)
    with pytest.raises(ValueError):
        R.rope_run(kern, x, [0, 1 << 17], 8, 1e4, 1.0, "norm")
    with pytest.raises(Exception, match="mode"):
        R.rope_run(kern, x, [0, 1], 8, 1e4, 1.0, "yarn")


def test_rope_in_several_dispatches(kern, monkeypatch):  # noqa: F811
    """Rows past one dispatch's MAX_ROWS go in further dispatches (row0): 7 rows at a time."""
    monkeypatch.setattr(R, "MAX_ROWS", 7)
    rng = np.random.default_rng(9)
    x = _specials(rng, (5, 4, 64))
    pos = _positions(rng, 5)
    got = R.rope_run(kern, x, pos, 32, 1e6, 1.0, "neox")
    want = _reference(x, pos, 32, 1e6, 1.0, "neox")
    assert _same(got, want), _diff(got, want)
