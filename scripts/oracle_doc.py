"""Write docs/ORACLE.md from a measured oracle run: the comparisons the oracle tests recorded.

    python -m pytest tests/oracle tests/runtime -m oracle      # records <cache>/oracle-results/<date>-<pid>.jsonl
    python scripts/oracle_doc.py [RESULTS.jsonl] [-o docs/ORACLE.md]

Without RESULTS, the newest file in <cache>/oracle-results/ ($BANKML_ORACLE_RESULTS sets where a run
records). Every table line is one comparison that ran; one that was not identical says so.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bankml.oracle.paths import cache_root  # noqa: E402
from bankml.passes.choose_attention_kernel import attention_order  # noqa: E402
from bankml.testing.oracle_results import read  # noqa: E402


def kernels(n: int) -> str:
    """The attention kernels a prompt of n tokens runs through, micro-batch by micro-batch."""
    ks = []
    for s in range(0, n, 512):
        t = min(512, n - s)
        ks.append(attention_order(t, max(256, -(-(s + t) // 256) * 256)).kernel.replace("flash_attn_ext_", ""))
    return " + ".join(dict.fromkeys(ks))


def split(name: str) -> tuple[str, str]:
    base, w = name.rsplit("-", 1)
    return base, w.upper()


def count(r: dict) -> str:
    cell = f"{r['identical']} / {r['compared']}"
    return cell if r["identical"] == r["compared"] else f"**{cell} (differs)**"


def model_cols(r: dict) -> list[str]:
    """model and weights; a quantized K/V cache is named beside the weights."""
    model, weights = split(r["model"])
    if (r.get("cache_type_k") or "f16", r.get("cache_type_v") or "f16") != ("f16", "f16"):
        weights += f", K/V cache {r['cache_type_k']}/{r['cache_type_v']}"
    return [model, weights]


def attention(r: dict) -> str:
    """The attention kernels of a prefill: a quantized cache runs one_chunk only."""
    if (r.get("cache_type_k") or "f16", r.get("cache_type_v") or "f16") != ("f16", "f16"):
        return "one_chunk (quantized cache)"
    return kernels(r["tokens"])


def table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + \
        ["| " + " | ".join(map(str, row)) + " |" for row in rows] + [""]


def render(run: dict, rows: list[dict]) -> str:
    ok = sum(r["identical"] == r["compared"] for r in rows)
    out = ["# Oracle results", "",
           f"bankml against {run['oracle']}: every logits row compared by sha256 of its f32 bytes, no tolerance.",
           f"Measured by `{run['command']}` on {run['date']} (bankml {run.get('commit') or 'unknown commit'}"
           + (f", {run['cpu']}" if run.get("cpu") else "") + ").",
           f"{len(rows)} comparisons: {ok} identical, {len(rows) - ok} not. Rendered by `scripts/oracle_doc.py`",
           "from the results file that run recorded (tests/conftest.py, bankml/testing/oracle_results.py).", ""]
    by_kind = lambda kind, **match: [r for r in rows if r["kind"] == kind  # noqa: E731
                                     and all(r.get(k) == v for k, v in match.items())]
    for backend in ("llvm", "reference"):
        prefill = by_kind("prefill", backend=backend)
        if prefill:
            out += [f"## Prefill, {backend} backend", ""]
            out += table(["model", "weights", "prompt tokens", "outputs", "threads (llama.cpp)", "attention kernel",
                          "rows identical / compared"],
                         [[*model_cols(r), r["tokens"], r["outputs"], f"{r['threads']} ({r['llama_threads']})",
                           attention(r), count(r)] for r in prefill])
    decode = by_kind("decode")
    if decode:
        out += ["## Greedy decodes (one llama_decode per token; tokens chosen by bankml's own logits)", ""]
        out += table(["model", "weights", "backend", "cells", "threads (llama.cpp)", "rows identical / compared"],
                     [[*model_cols(r), r["backend"], f"{r['tokens'] + 1}–{r['cells']}",
                       f"{r['threads']} ({r['llama_threads']})", count(r)] for r in decode])
    named = by_kind("named_tensors")
    if named:
        out += ["## Named tensors (every tensor llama.cpp's eval callback reports)", ""]
        out += table(["model", "weights", "backend", "prompt tokens", "outputs", "decodes to", "tensors identical / "
                      "compared"], [[*model_cols(r), r["backend"], r.get("tokens", "–"), r.get("outputs", "–"), r.get("cells", "–"),
                                     count(r)] for r in named])
    gen = by_kind("generate")
    if gen:
        out += ["## Generation (token ids against llama-server's /completion)", ""]
        groups: dict[tuple, list[dict]] = {}
        for r in gen:
            groups.setdefault((tuple(model_cols(r)), r["backend"], r.get("temp", 0)), []).append(r)
        out += table(["model", "weights", "backend", "temperature", "prompts (seeds)", "runs identical",
                      "tokens identical / compared"],
                     [[*m, b, t, len(rs) if t == 0 else f"{len(rs)} ({len({r['seed'] for r in rs})})",
                       f"{sum(r['identical'] == r['compared'] for r in rs)} / {len(rs)}",
                       count({"identical": sum(r["identical"] for r in rs),
                              "compared": sum(r["compared"] for r in rs)})] for (m, b, t), rs in groups.items()])
    return "\n".join(out)


def newest() -> Path:
    found = sorted((cache_root() / "oracle-results").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"Error: no results in {cache_root() / 'oracle-results'}; run the oracle tests first")
    return found[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", type=Path, help="a results file (default: the newest)")
    ap.add_argument("-o", "--out", type=Path, default=ROOT / "docs" / "ORACLE.md")
    args = ap.parse_args()
    try:
        run, rows = read(args.results or newest())
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"Error: {e}")
    args.out.write_text(render(run, rows))
    print(f"{args.out}: {len(rows)} comparisons from {run['command']!r} on {run['date']}")


if __name__ == "__main__":
    main()
