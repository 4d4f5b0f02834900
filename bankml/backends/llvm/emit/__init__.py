"""The llvm backend's emit vocabulary: LLVM types, loops, functions and run-time sizes (core), the
SIMD steps and horizontal sums in ggml's orders (simd), ggml_v_expf (expf)."""
