"""Float-order profiles: which arithmetic a graph's nodes follow.

- "ggml" (the default): the bits of llama.cpp b11434's AVX2 build (bankml/ir/order.py).
- "portable": bankml's own arithmetic, the same bits on every backend and device
  (bankml/profiles/portable/, docs/PORTABLE.md).
"""
PROFILES = ("ggml", "portable")
