"""A node of the IR: immutable; passes make new ones with replace()."""
from __future__ import annotations

from dataclasses import dataclass, field, replace as _replace

from bankml.ir.ops import Op
from bankml.ir.order import FloatOrder


@dataclass(frozen=True)
class Node:
    id: int                              # creation index, unique in its graph
    op: Op
    inputs: tuple[int, ...]              # operand ids, in operand order
    shape: tuple[int, ...]               # numpy order: [n_tokens, n_embd], rows first
    dtype: str                           # "f32" | "f16" | "i32" | a ggml weight type name
    name: str | None = None              # llama.cpp's tensor name: "attn_norm-0", "Qcur-3", "result_norm"
    order: FloatOrder | None = None      # the float order of its computation; None for exact ops
    params: dict = field(default_factory=dict, compare=False, hash=False)

    def replace(self, **kw) -> "Node":
        return _replace(self, **kw)
