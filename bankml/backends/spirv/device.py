"""Decode's Q1_0 matvecs on a Vulkan device; every other op stays on the CPU (docs/spirv.md).

    mg = for_setting(model.gpu)                 # a ModelGpu, or None: CPU only (Model.device)
    y = mg.gpu_matvec(name, w_raw, act)         # [1, rows] f32, or None when it does not fit

Which mat-muls run here is one pass's rule (passes/place_on_device.py), which marks them when
the model has a device; the backends hand this the marked nodes.

The device is chosen once per process and setting (load(gpu=...), else BANKML_GPU, default off)
by q1.device_check.select_device, which admits a device only after the on-device oracle; a refusal
is said once on stderr and bankml stays on the CPU. Each model keeps its own uploaded weights,
one Q1Matvec per weight tensor, made the first time that matrix meets a single-row activation.
The kernel is ggml_vec_dot_q1_0_q8_0 bit for bit, the order choose_matmul_kernel gives Q1_0.
"""
from __future__ import annotations

import os

import click
import numpy as np

from bankml.backends.spirv.q1 import device_check
from bankml.backends.spirv.q1.matvec import Q1_BYTES
from bankml.backends.spirv.runtime import Device, Q1Matvec
from bankml.quants.activation import Q8Act, to_bytes

_CHOICES: dict[str, device_check.GpuChoice] = {}            # setting -> choice, per process


def setting(gpu: str | int | None) -> str:
    """load()'s gpu= as a BANKML_GPU string: None reads the environment (default off)."""
    s = os.environ.get("BANKML_GPU", "off") if gpu is None else str(gpu)
    return s.strip().lower() or "off"


def device(gpu: str | int | None = None) -> Device | None:
    """The device this process uses for this setting, or None (the reason said once on stderr)."""
    s = setting(gpu)
    if s not in _CHOICES:
        choice = device_check.select_device(s)
        if choice.device is None and s not in ("off", "none"):
            click.echo(f"bankml: {choice.reason}", err=True)
        _CHOICES[s] = choice
    return _CHOICES[s].device


class ModelGpu:
    """One model's Q1_0 matrices on one device, each uploaded the first time it is used."""

    def __init__(self, dev: Device):
        self.device = dev
        self.mats: dict[str, Q1Matvec] = {}
        self.calls = 0                                   # matvecs run on the device

    def gpu_matvec(self, tensor_name: str, w_raw: np.ndarray, act) -> np.ndarray | None:
        """w · act for Q1_0 rows w_raw [rows, row_bytes] and one q8_0 row (a node placed here):
        [1, rows] f32, or None when the rows do not fit the device kernel (the CPU runs it)."""
        if not isinstance(act, Q8Act) or act.s is not None:
            return None
        return self.matvec_bytes(tensor_name, w_raw, to_bytes(act).tobytes(), act.q.shape[1])

    def matvec_bytes(self, tensor_name: str, w_raw: np.ndarray, act_raw: bytes, k: int) -> np.ndarray | None:
        """The same from the raw q8_0 bytes of one activation row of k values (the llvm backend's buffer)."""
        rows = w_raw.shape[0]
        if k % 128 or w_raw.ndim != 2 or w_raw.shape[1] != k // 128 * Q1_BYTES or len(act_raw) != k // 32 * 34:
            return None
        mv = self.mats.get(tensor_name)
        if mv is None:
            mv = Q1Matvec(self.device).upload(np.ascontiguousarray(w_raw, np.uint8).tobytes(), rows, k)
            self.mats[tensor_name] = mv
        self.calls += 1
        return mv.run(act_raw)[None, :]

    def close(self) -> None:
        """Free the uploaded weights now (else they live as long as the device)."""
        for mv in self.mats.values():
            mv.close()
        self.mats = {}


def for_setting(gpu: str | int | None) -> ModelGpu | None:
    """A ModelGpu for one model on the device of this setting (load()'s gpu: None | "auto" |
    "off" | index), or None: CPU only. The model closes it."""
    dev = device(gpu)
    return None if dev is None else ModelGpu(dev)
