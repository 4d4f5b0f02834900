"""The portable profile: one arithmetic whose bits are the same on numpy, the AVX2 JIT and a GPU.

This package is its definition, written as numpy (docs/PORTABLE.md explains it):
  arith.py      f32 steps with flush-to-zero and one NaN; the lane+tree fold; exact sums rounded once
  tables.py     every constant and table, computed from Python's decimal module (no libm)
  funcs.py      exp, ln, rsqrt, recip, sigmoid, silu, softplus, softmax, rmsnorm, l2norm, argmax
  quant.py      activation blocks (m*2^e scales), weight types as integers, the exact group dot
  rope.py       the rotation table (angles in turns, exact) and the rotation
  attention.py  the int8 K/V cache with f16 row scales and the attention over it
  orders.py     the profile's float orders as IR data
"""
