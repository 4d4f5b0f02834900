"""The SPIR-V backend: the Q1_0 x q8_0 matvec on Vulkan, bit-identical to ggml-cpu (docs/spirv.md).

builder: the SPIR-V words (plus spirv-val / spirv-dis) · q1.matvec: the kernel emitter ·
runtime: the Vulkan runner · q1.device_check: the on-device oracle and BANKML_GPU · reference: numpy.
Importing this package does not load Vulkan.
"""
from bankml.backends.spirv.builder import disassemble, validate

__all__ = ["disassemble", "validate"]
