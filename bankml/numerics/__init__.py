"""The scalar arithmetic the specs build on, in numpy: glibc's expf/logf (libm), ggml's vectorized
expf (expf) and f16 GELU table (gelu), IEEE helpers (floats), libstdc++'s sorts (stdsort)."""
