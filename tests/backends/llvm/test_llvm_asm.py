"""The machine code of a whole compiled graph is AVX2 (ymm, never zmm) and fuses exactly where the
float order says fma: vfmadd in the fma kernels, none in the kernels whose order has no fma."""
from __future__ import annotations

import re

from llvmlite import ir

import bankml
from bankml.backends.llvm import compile as llvm_graph
from bankml.backends.llvm import jit, registry
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import ELEMENTWISE
from bankml.testing import models


def _function_asm(text: str, name: str) -> str:
    start = text.index(f"\n{name}:")
    return text[start: text.index(".Lfunc_end", start)]


def test_graph_asm_is_ymm_with_vfmadd_and_no_zmm():
    m = bankml.load(models.path("smollm2-q4_1"), threads=2)
    g = m.graph(1, 256, 1)
    glue, kernels = llvm_graph.emit(g)[:2]
    for opt in (False, True):
        text = "".join(jit.asm(mod, optimize=opt) for mod in (glue, *kernels))
        assert "zmm" not in text
        assert "ymm" in text
        assert re.search(r"vfmadd\d+[ps]s", text)


def test_unfused_kernels_have_no_vfmadd():
    g = Graph()
    for n in (Node(0, Op.INPUT, (), (4, 64), "f32", params={"input": "a"}),
              Node(1, Op.WEIGHT, (), (64,), "F32", params={"tensor": "w", "ggml_type": 0}),
              Node(2, Op.MUL, (0, 1), (4, 64), "f32", order=ELEMENTWISE),
              Node(3, Op.ADD, (2, 0), (4, 64), "f32", order=ELEMENTWISE)):
        g.add(n)
    mod = ir.Module()
    for n in (g[2], g[3]):
        registry.define(mod, g, n).linkage = "external"
    text = jit.asm(mod, optimize=True)
    for n in (g[2], g[3]):
        body = _function_asm(text, registry.kernel_name(n))
        assert "vmulps" in body or "vaddps" in body
        assert "vfmadd" not in body and "zmm" not in body
