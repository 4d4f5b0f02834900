"""The on-device oracle: a Vulkan device joins only if its Q1_0 matvecs equal the CPU's bits.

    choice = select_device()          # reads BANKML_GPU = auto | off | <index>  (default off)
    choice.device                     # a runtime.Device, or None: stay on the CPU
    choice.reason                     # one line: why this device, or why none

Before a device joins, a fixed set of matvecs (real shapes 2048x2048, 6144x2048, 2048x6144 as
rows x K; Qwen3 test shapes 512x512, 1536x512; random data; edge values: largest and subnormal f16
scales, zero and -0 scales, q8 values +-127 and -128, every bit pattern) runs on it and on the CPU
(reference.q1_matvec). Every output must be bit-identical.

Denormals: no f32 value in this kernel can be subnormal (all are multiples of 2^-48, see
backends/spirv/q1/matvec.py), so a device without f32 DenormPreserve (lavapipe) cannot differ through flushing;
the edge case with 2^-24 scales on both sides reaches the smallest products (2^-48) to show it.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from bankml.backends.spirv.q1 import reference
from bankml.backends.spirv import runtime
from bankml.backends.spirv.runtime import Device, DeviceRefused, Q1Matvec, VulkanUnavailable
from bankml.errors import BankmlError

SHAPES = ((2048, 2048), (6144, 2048), (2048, 6144), (512, 512), (1536, 512))  # (rows, K)
F16_EDGES = np.array([65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 2.0 ** -14, 0.0, -0.0, 1.0,
                      -1.0, 0.5, 1.0009765625, 3.0517578125e-05], np.float16)


@dataclass(frozen=True)
class Case:
    name: str
    rows: int
    k: int
    w: bytes      # raw Q1_0 rows
    act: bytes    # raw q8_0 row


def _pack(d_w: np.ndarray, qs: np.ndarray) -> bytes:
    """Q1_0 rows from scales [rows, nb] (f16) and bit bytes [rows, nb, 16]."""
    rows, nb = d_w.shape
    out = np.zeros((rows, nb, 18), np.uint8)
    out[:, :, 0:2] = d_w.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    out[:, :, 2:] = qs
    return out.tobytes()


def _act(d: np.ndarray, q: np.ndarray) -> bytes:
    """A q8_0 row from scales [nblocks] (f16) and int8 values [nblocks, 32]."""
    out = np.zeros((d.size, 34), np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    return out.tobytes()


def random_case(rows: int, k: int, seed: int, name: str = "random") -> Case:
    """Scales like real Q1_0/q8_0 rows, uniform bits, q8 values over [-127, 127]."""
    rng = np.random.default_rng(seed)
    nb = k // 128
    d_w = np.abs(rng.normal(0, 0.02, (rows, nb))) + 1e-3
    qs = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    d_a = np.abs(rng.normal(0, 0.03, k // 32)) + 1e-4
    q = rng.integers(-127, 128, (k // 32, 32))
    return Case(f"{rows}x{k} {name}", rows, k, _pack(d_w, qs), _act(d_a, q))


def edge_case(rows: int = 64, k: int = 512, seed: int = 7) -> Case:
    """f16 extremes (65504, 2^-24, +-0) as scales, q8 at +-127/-128/0, all-ones/zeros bits."""
    rng = np.random.default_rng(seed)
    nb = k // 128
    d_w = rng.choice(F16_EDGES, (rows, nb))
    d_w[0], d_w[1] = 2.0 ** -24, 65504.0
    patterns = np.array([0x00, 0xFF, 0x55, 0xAA, 0x0F], np.uint8)
    qs = np.where(rng.random((rows, nb, 16)) < 0.5, rng.choice(patterns, (rows, nb, 16)),
                  rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8))
    d_a = rng.choice(F16_EDGES, k // 32)
    d_a[:4] = 2.0 ** -24
    q = rng.choice(np.array([127, -127, -128, 0, 1, -1]), (k // 32, 32))
    return Case(f"{rows}x{k} edges", rows, k, _pack(d_w, qs), _act(d_a, q))


def wide_case(rows: int = 256, k: int = 2048, seed: int = 11) -> Case:
    """Scales over the whole f16 range (2^-24 .. 2^15): cancellations, every rounding situation."""
    rng = np.random.default_rng(seed)
    nb = k // 128
    sign = np.where(rng.random((rows, nb)) < 0.5, -1.0, 1.0)
    d_w = sign * rng.integers(1, 2048, (rows, nb)) * np.exp2(rng.integers(-24, 5, (rows, nb)))
    d_a = rng.integers(1, 2048, k // 32) * np.exp2(rng.integers(-24, 5, k // 32))
    qs = rng.integers(0, 256, (rows, nb, 16), dtype=np.uint8)
    q = rng.integers(-128, 128, (k // 32, 32))
    return Case(f"{rows}x{k} wide-range", rows, k, _pack(d_w, qs), _act(d_a, q))


@functools.cache
def oracle_cases() -> tuple[Case, ...]:
    return tuple([random_case(r, k, seed=i) for i, (r, k) in enumerate(SHAPES)] + [edge_case(), wide_case()])


def mismatch(case: Case, got: np.ndarray, want: np.ndarray) -> str | None:
    """None when bit-identical, else one line naming the case, the count and the first row."""
    g, w = got.view(np.uint32), want.view(np.uint32)
    bad = np.flatnonzero(g != w)
    if bad.size == 0:
        return None
    r = int(bad[0])
    return (f"Q1_0 matvec {case.name}: {bad.size} of {case.rows} rows differ from the CPU "
            f"(row {r}: {got[r]!r} 0x{g[r]:08x}, CPU {want[r]!r} 0x{w[r]:08x})")


def check_device(dev: Device, variant: str = "exact", cases=None, corrupt=None) -> None:
    """Run the oracle on dev; raise DeviceRefused naming the first case that differs.

    corrupt: a function (case, outputs) -> outputs applied to the device's results (tests use it
    to inject a mismatch).
    """
    for case in cases if cases is not None else oracle_cases():
        mv = Q1Matvec(dev, variant)
        try:
            got = mv.upload(case.w, case.rows, case.k).run(case.act)
        finally:
            mv.close()
        if corrupt is not None:
            got = corrupt(case, got)
        why = mismatch(case, got, reference.q1_matvec(case.w, case.rows, case.k, case.act))
        if why:
            raise DeviceRefused(f"Vulkan device {dev.info} failed the on-device oracle: {why}; "
                                "staying on the CPU")


@dataclass(frozen=True)
class GpuChoice:
    device: Device | None
    reason: str


def select_device(setting: str | None = None) -> GpuChoice:
    """BANKML_GPU (or setting): off (default) | auto (first device that passes) | <index>."""
    s = (setting if setting is not None else os.environ.get("BANKML_GPU", "off")).strip().lower()
    if s in ("", "off", "none"):
        return GpuChoice(None, "BANKML_GPU=off: CPU only")
    if s != "auto" and not s.isdigit():
        raise BankmlError(f"BANKML_GPU={s!r}: want auto, off or a Vulkan device index")
    try:
        infos = runtime.devices()
    except VulkanUnavailable as e:
        return GpuChoice(None, f"{e}; staying on the CPU")
    picks = [i.index for i in infos] if s == "auto" else [int(s)]
    reasons = []
    for idx in picks:
        try:
            dev = runtime.open_device(idx)
            check_device(dev)
            return GpuChoice(dev, f"Vulkan device {dev.info} passed the on-device oracle "
                                  f"({len(oracle_cases())} Q1_0 matvecs bit-identical)")
        except (VulkanUnavailable, DeviceRefused) as e:
            reasons.append(str(e))
    return GpuChoice(None, "; ".join(reasons) or "no Vulkan device")
