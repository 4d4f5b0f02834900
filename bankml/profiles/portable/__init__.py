"""The portable profile: one arithmetic whose bits are the same on numpy, the AVX2 JIT and a GPU.

This package is its definition, written as numpy (docs/PORTABLE.md explains it, and has the
conformance table against the decode-arithmetic document, ../shared/specs/decode-arithmetic.txt):
  arith.py      f32 steps with flush-to-zero and one NaN; the lane+tree fold; exact sums rounded once
  tables.py     every constant and table, computed from Python's decimal module (no libm)
  funcs.py      exp, ln, ln1p, rsqrt, recip, sigmoid, silu, softplus, softmax, rmsnorm, l2norm,
                argmax, hadamard
  gdn.py        Gated-DeltaNet: conv, gdn_update, gdn_row, gdn_read, gdn_flush, gdn_fold(_trailing), Logged
  quant.py      activation blocks (m*2^e scales: Sub32 and PerBlock), weight types as integers
                (reads, Unreadable), the exact group dot
  coded.py      coded rows (Scale, Segment, CodedRow, COEF_BOUND; K-quants too) and `dot` under
                either ActScaling
  rotary.py     the rotation table (angles in turns, exact) and the rotation (the document's rope)
  attention.py  the int8 K/V cache (int8_codes, cache_row) and the attention over it (quantize_head,
                int8_score, weighted_int8, attend_int8; attend_vector over f32 rows)
  orders.py     the profile's float orders as IR data

The document's names are importable from here where bankml has them (fadd is arith.add, ActRow
is quant.ActBlocks, ...).
"""
from bankml.profiles.portable.arith import LANES, NAN, SUM_WINDOW, FpUnit, f32_to_f16, fdot, ftz, rne, tree
from bankml.profiles.portable.arith import round_exact as exact_sum
from bankml.profiles.portable.arith import add as fadd
from bankml.profiles.portable.arith import fold_sum as fsum
from bankml.profiles.portable.arith import mul as fmul
from bankml.profiles.portable.arith import sub as fsub
from bankml.profiles.portable.arith import int_to_f32 as scaled_to_f32
from bankml.profiles.portable.arith import scale2 as ldexp
from bankml.profiles.portable.funcs import (absmax, argmax, exp, fmax, hadamard, l2norm, ln, ln1p, recip, rmsnorm,
                                            rsqrt, sigmoid, silu, softmax, softplus)
from bankml.profiles.portable.gdn import (Logged, conv, gdn_flush, gdn_fold, gdn_fold_trailing, gdn_read, gdn_row,
                                          gdn_update)
from bankml.profiles.portable.attention import (VALUE_BLOCK, attend_int8, attend_vector, cache_row, int8_codes,
                                                int8_score, quantize_head, weighted_int8)
from bankml.profiles.portable.coded import COEF_BOUND, CodedRow, Scale, Segment, dot, reads
from bankml.profiles.portable.quant import (GROUP, WIDE_BITS, ActScale, ActScaling, Unreadable, Words,
                                            quantize_blocks, rne_div, wide_scale)
from bankml.profiles.portable.quant import ActBlocks as ActRow
from bankml.profiles.portable.quant import QK as ACT_BLOCK
from bankml.profiles.portable.quant import act_scale as block_scale
from bankml.profiles.portable.quant import quantize_act as quantize
from bankml.profiles.portable.rotary import rope
from bankml.profiles.portable.tables import constants as _constants

INV_127 = _constants()["INV_127"]            # 1/127 rounded once to f32: the int8 cache's scale per unit of absmax

__all__ = ["LANES", "GROUP", "SUM_WINDOW", "exact_sum", "fadd", "fsub", "fmul", "fsum", "fdot", "tree", "ldexp",
           "scaled_to_f32", "fmax",
           "absmax", "exp", "ln", "ln1p", "recip", "rsqrt", "sigmoid", "silu", "softplus", "softmax",
           "rmsnorm", "l2norm", "argmax", "hadamard", "Logged", "conv", "gdn_update", "gdn_row", "gdn_read",
           "gdn_flush", "gdn_fold", "gdn_fold_trailing", "int8_codes", "cache_row", "attend_vector",
           "quantize_head", "int8_score", "weighted_int8", "attend_int8", "VALUE_BLOCK", "reads", "Unreadable",
           "ACT_BLOCK", "WIDE_BITS", "ActScaling", "block_scale", "wide_scale", "quantize", "quantize_blocks",
           "dot", "Scale", "Segment", "CodedRow", "COEF_BOUND", "ActRow", "ActScale", "INV_127", "NAN", "f32_to_f16",
           "ftz", "rne", "rne_div", "rope", "FpUnit", "Words"]
