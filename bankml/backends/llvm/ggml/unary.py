"""SIGMOID and SOFTPLUS kernels: ggml-cpu/unary-ops.cpp's op_sigmoid and op_softplus, one
element at a time, glibc's expf and logf called as the haswell build calls them (the reference
backend's bankml/backends/reference/unary.py spells the same):

    sigmoid: r(1 / r(1 + expf(-x)))
    softplus: x > 20 ? x : logf(r(1 + expf(x)))
"""
from __future__ import annotations

from llvmlite import ir

from bankml.backends.llvm.emit.core import f32, intrinsic
from bankml.backends.llvm.ggml.glu import elementwise
from bankml.backends.llvm.registry import kernel
from bankml.errors import LoweringError
from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op
from bankml.ir.order import SIGMOID, SOFTPLUS, FloatOrder


def _check(n: Node, want: FloatOrder) -> None:
    if n.order != want:
        raise LoweringError(f"llvm backend: {n.op.value} lowers only {want.describe()!r} ({n.name or n.id})")


def _libm(b: ir.IRBuilder, name: str, x: ir.Value) -> ir.Value:
    return b.call(intrinsic(b.module, name, f32, [f32]), [x])


@kernel(Op.SIGMOID, order=SIGMOID)
def define_sigmoid(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, SIGMOID)
    return elementwise(m, n, 1, lambda b, x: b.fdiv(f32(1.0), b.fadd(f32(1.0), _libm(b, "expf", b.fneg(x)))))


@kernel(Op.SOFTPLUS, order=SOFTPLUS)
def define_softplus(m: ir.Module, g: Graph, n: Node) -> ir.Function:
    _check(n, SOFTPLUS)

    def emit(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        y = _libm(b, "logf", b.fadd(f32(1.0), _libm(b, "expf", x)))
        return b.select(b.fcmp_ordered(">", x, f32(20.0)), x, y)
    return elementwise(m, n, 1, emit)
