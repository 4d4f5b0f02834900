"""A Vulkan device joins only after the on-device oracle; otherwise bankml says why and stays on CPU."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from bankml.backends.spirv.q1 import device_check
from bankml.backends.spirv import runtime
from bankml.errors import BankmlError


@pytest.fixture(scope="module")
def dev():
    return runtime.open_device(0)


def test_lavapipe_passes_the_on_device_oracle(dev):
    device_check.check_device(dev)


def test_a_kernel_that_rounds_the_outer_fma_twice_is_refused_with_the_reason(dev):
    with pytest.raises(runtime.DeviceRefused) as e:
        device_check.check_device(dev, variant="fma_mul_add")
    msg = str(e.value)
    assert "failed the on-device oracle" in msg and "rows differ from the CPU" in msg
    assert "staying on the CPU" in msg and "\n" not in msg


def test_an_injected_one_bit_mismatch_is_refused_naming_case_and_row(dev):
    def flip(case, y):
        if case.name.startswith("6144x2048"):
            y = y.copy()
            y.view(np.uint32)[77] ^= 1
        return y
    with pytest.raises(runtime.DeviceRefused, match=r"6144x2048 random: 1 of 6144 rows .*row 77"):
        device_check.check_device(dev, corrupt=flip)


def test_oracle_covers_the_real_and_test_shapes_and_edges():
    names = [c.name for c in device_check.oracle_cases()]
    for r, k in [(2048, 2048), (6144, 2048), (2048, 6144), (512, 512), (1536, 512)]:
        assert f"{r}x{k} random" in names
    assert any("edges" in n for n in names) and any("wide-range" in n for n in names)


def test_bankml_gpu_off_stays_on_cpu():
    choice = device_check.select_device("off")
    assert choice.device is None and "off" in choice.reason


def test_bankml_gpu_auto_picks_lavapipe_after_the_oracle():
    choice = device_check.select_device("auto")
    assert choice.device is not None and "passed the on-device oracle" in choice.reason


def test_bankml_gpu_index_out_of_range_stays_on_cpu_with_reason():
    choice = device_check.select_device("7")
    assert choice.device is None and "no device 7" in choice.reason


def test_bankml_gpu_garbage_is_refused():
    with pytest.raises(BankmlError, match="BANKML_GPU='fast': want auto, off or a Vulkan device index"):
        device_check.select_device("fast")


def _without_driver(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, VK_ICD_FILENAMES="/nonexistent/icd.json", VK_DRIVER_FILES="/nonexistent/icd.json")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_no_vulkan_driver_is_one_clear_error():
    p = _without_driver("from bankml.backends.spirv import runtime\n"
                        "try:\n    runtime.devices()\nexcept runtime.VulkanUnavailable as e:\n"
                        "    print('ERR', e)\n")
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip()
    assert line.startswith("ERR Vulkan: ") and "install_vulkan_cpu.sh" in line and "\n" not in line


def test_no_vulkan_driver_with_auto_stays_on_cpu():
    p = _without_driver("from bankml.backends.spirv.q1 import device_check as d\n"
                        "c = d.select_device('auto'); print(c.device is None, c.reason)")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("True Vulkan: ") and "staying on the CPU" in p.stdout
