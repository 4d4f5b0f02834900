"""The table a backend keeps its kernels in: one entry per (profile, op, float order).

    KERNELS = KernelTable("llvm")

    @KERNELS.register(Op.FLASH_ATTN, order=FA_TILED)
    def define_tiled(m, g, n): ...

    fn = KERNELS.lookup(g, n)        # the entry of (g's profile, n.op, n.order), or LoweringError

A kernel registers under the float orders it implements (a FloatOrder, a tuple of them, or None
for an op without one), so a dispatcher is a lookup: no kernel imports the specialists of its op,
and a node whose order has no kernel is refused naming its op, order and profile, never lowered
by a neighbour's code.
"""
from __future__ import annotations

from typing import Callable, Iterable

from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import FloatOrder
from bankml.profiles import PROFILES

Orders = FloatOrder | None | Iterable[FloatOrder | None]


class KernelTable:
    def __init__(self, backend: str):
        self.backend = backend
        self.entries: dict[tuple[str, Op, FloatOrder | None], Callable] = {}

    def register(self, op: Op, order: Orders = None, profile: str | tuple[str, ...] = "ggml"):
        """Decorator: fn is the kernel of op in each of these orders and profiles."""
        orders = tuple(order) if isinstance(order, (tuple, list, frozenset, set)) else (order,)
        profiles = profile if isinstance(profile, tuple) else (profile,)
        for o in orders:
            if o is not None and not isinstance(o, FloatOrder):
                raise TypeError(f"{self.backend} kernel for {op.value}: order {o!r} is not a FloatOrder")
        for p in profiles:
            if p not in PROFILES:
                raise ValueError(f"{self.backend} kernel for {op.value}: unknown profile {p!r}")

        def wrap(fn: Callable) -> Callable:
            for p in profiles:
                for o in orders:
                    key = (p, op, o)
                    if key in self.entries and self.entries[key] is not fn:
                        raise ValueError(f"{self.backend}: two kernels for {op.value} {_describe(o)} in profile {p}")
                    self.entries[key] = fn
            return fn
        return wrap

    def lookup(self, g: Graph, n: Node) -> Callable:
        profile = g.meta.get("profile", "ggml")
        fn = self.entries.get((profile, n.op, n.order))
        if fn is None:
            raise LoweringError(f"no {self.backend} kernel for {n.op.value} {_describe(n.order)} "
                                f"({n.name or n.id}) in profile {profile}")
        return fn

    def orders(self, op: Op, profile: str = "ggml") -> list[FloatOrder | None]:
        """The orders of op that have a kernel here."""
        return [o for p, x, o in self.entries if p == profile and x is op]


def _describe(order: FloatOrder | None) -> str:
    return f"in order {order.describe()}" if order is not None else "without a float order"
