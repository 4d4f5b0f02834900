"""The ggml profile's kernels on AVX2: llama.cpp b11434's float orders, one module per op family.
Importing this package registers every kernel (registry.KERNELS, profile "ggml")."""
from bankml.backends.llvm.ggml import attention, glu, matmul, norm, quantize, recurrent, rope, rows  # noqa: F401
