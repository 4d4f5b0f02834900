"""flash_attn_ext in ggml's three orders: one_chunk (and split-KV), tiled, and one_chunk over a
quantized cache with its Hadamard rotations (quant_cache)."""
from bankml.backends.llvm.ggml.attention import one_chunk, quant_cache, tiled  # noqa: F401
