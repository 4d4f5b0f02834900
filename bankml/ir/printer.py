"""The IR as text (one node a line) and as Graphviz."""
from __future__ import annotations

from bankml.ir.graph import Graph
from bankml.ir.node import Node
from bankml.ir.ops import Op


def _operand(g: Graph, i: int) -> str:
    n = g[i]
    if n.op is Op.WEIGHT:
        return f"%{i} {n.params['tensor']}:{n.dtype}"
    return f"%{i}"


def _params(n: Node) -> str:
    skip = {"tensor", "ggml_type", "input"}
    items = [f"{k}={v}" for k, v in n.params.items() if k not in skip]
    return " ".join(items)


def format_node(g: Graph, n: Node) -> str:
    shape = "[" + ",".join(str(d) for d in n.shape) + "]"
    srcs = " ".join(_operand(g, i) for i in n.inputs)
    line = f"%{n.id:<4} {n.name or '-':<24} {n.op.value:<10} {shape:<16} {n.dtype:<6}"
    if srcs:
        line += f" <- {srcs}"
    extra = " ".join(x for x in (n.order.describe() if n.order else "", _params(n)) if x)
    if extra:
        line += f" | {extra}"
    return line.rstrip()


def dump(g: Graph) -> str:
    """One node a line, in execution order; weights and inputs first as they are used."""
    head = " ".join(f"{k}={v}" for k, v in g.meta.items())
    lines = [f"# graph {head}"]
    for n in g:
        if n.op is Op.WEIGHT:
            continue
        lines.append(format_node(g, n))
    lines.append("# outputs " + " ".join(f"{k}=%{v}" for k, v in g.outputs.items()))
    return "\n".join(lines) + "\n"


def to_dot(g: Graph) -> str:
    """Graphviz source: one box per node, weights as notes."""
    out = ["digraph bankml {", "  rankdir=TB; node [shape=box, fontname=monospace, fontsize=10];"]
    for n in g:
        label = f"{n.name or n.op.value}\\n{n.op.value} {list(n.shape)}"
        if n.order is not None:
            label += f"\\n{n.order.kernel}"
        shape = "note" if n.op is Op.WEIGHT else "box"
        out.append(f'  n{n.id} [label="{label}", shape={shape}];')
        for i in n.inputs:
            out.append(f"  n{i} -> n{n.id};")
    out.append("}")
    return "\n".join(out) + "\n"
