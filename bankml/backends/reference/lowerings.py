"""The reference backend's one lowering table: numpy functions by (profile, op, float order).

    @lowers(Op.RMS_NORM, order=fo.RMS_NORM)                         # ggml.py
    def _rms_norm(env, g, n, x): ...
    @lowers(Op.RMS_NORM, order=po.RMS_NORM, profile="portable")     # portable.py
    def _rms_norm(env, g, n, x): ...

A lowering takes (env, g, n, *input values) and returns the node's value; ggml.py holds the ggml
profile's (and the exact ops both profiles share), portable.py the portable profile's.
"""
from __future__ import annotations

from bankml.backends.registry import KernelTable

LOWERINGS = KernelTable("reference")
lowers = LOWERINGS.register
