"""The house stays a house: bankml's imports run downward through its layers, with no circle.

Every import is read from the source (module level and inside functions alike: a lazy import is
still a dependency), `from package import module` counting as an import of that module. The
layers, lowest first, are docs/LAYOUT.md's; a module may import its own layer and those below.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "bankml"

# lowest first; "bankml" is the package's face (bankml.load), above the runtime it re-exports
LAYERS = [
    ("_version", "errors", "numerics", "oracle"),
    ("ir",),
    ("quants", "gguf"),
    ("profiles", "tokenizer"),
    ("arch",),
    ("passes",),
    ("backends",),
    ("runtime",),
    ("bankml",),
    ("server", "diff", "testing"),
    ("cli", "cli_sampler", "cli_chat"),
]
RANK = {part: k for k, parts in enumerate(LAYERS) for part in parts}
MAX_MODULES = 15


def modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = ["bankml", *p.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(mods: dict[str, Path]) -> nx.DiGraph:
    """module -> module it imports (only bankml's own)."""
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in mods else base)
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    g.add_edge(name, t)
    return g


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else "bankml"


def test_every_module_has_a_layer():
    missing = sorted({layer(m) for m in modules()} - set(RANK))
    assert not missing, f"packages with no layer in LAYERS (and docs/LAYOUT.md): {missing}"


def test_no_import_circle():
    g = imports(modules())
    circles = [c for c in nx.simple_cycles(g) if len(c) > 1]
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c + c[:1]) for c in circles[:10])


def test_no_circle_between_packages():
    g = imports(modules())
    pk = nx.DiGraph((layer(a), layer(b)) for a, b in g.edges if layer(a) != layer(b))
    circles = list(nx.simple_cycles(pk))
    assert not circles, f"packages that import each other: {circles}"


def test_nothing_imports_upward():
    g = imports(modules())
    up = sorted(f"{a} -> {b}" for a, b in g.edges if RANK[layer(b)] > RANK[layer(a)])
    assert not up, "imports that run up a layer:\n" + "\n".join(up)


def test_no_folder_holds_more_than_15_modules():
    crowded = {str(d.relative_to(PACKAGE.parent)): n for d in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
               if (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"])) > MAX_MODULES}
    assert not crowded, f"folders over {MAX_MODULES} modules: {crowded}"


def test_the_check_sees_a_circle_and_an_upward_import(tmp_path):
    """The walk itself: a lazy import inside a function and `from package import module` count."""
    pkg = tmp_path / "bankml"
    (pkg / "ir").mkdir(parents=True)
    (pkg / "runtime").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ir" / "__init__.py").write_text("")
    (pkg / "runtime" / "__init__.py").write_text("")
    (pkg / "ir" / "a.py").write_text("def f():\n    from bankml.runtime import b\n")
    (pkg / "runtime" / "b.py").write_text("from bankml.ir import a\n")
    global PACKAGE
    real, PACKAGE = PACKAGE, pkg
    try:
        g = imports(modules())
    finally:
        PACKAGE = real
    assert ("bankml.ir.a", "bankml.runtime.b") in g.edges and ("bankml.runtime.b", "bankml.ir.a") in g.edges
    assert RANK[layer("bankml.runtime.b")] > RANK[layer("bankml.ir.a")]
