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
from bankml.errors import LoweringError
from bankml.ir.order import FloatOrder

LOWERINGS = KernelTable("reference")
lowers = LOWERINGS.register


def check_order(order: FloatOrder, want: FloatOrder, op: str) -> None:
    """A numpy function's refusal of a float order it does not spell."""
    if order != want:
        raise LoweringError(f"reference backend: {op} lowers only {want.describe()!r}, not {order.describe()!r}")
