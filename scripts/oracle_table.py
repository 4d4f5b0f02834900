"""Print a measured oracle table: model x weight type x prompt length x kernel, rows identical / rows compared.

    python scripts/oracle_table.py [--quick] [--reference]

Runs bankml (its default llvm backend; --reference for numpy) and llama.cpp on the same token lists
and compares every logits row by sha256 of its f32 bytes.
"""
from __future__ import annotations

import platform
import sys
import time

import numpy as np

import bankml
from bankml import oracle
from bankml.passes.choose_attention_kernel import attention_order
from bankml.testing import models

PROMPTS = [1, 7, 63, 64, 65, 600]
MODELS = ["smollm2-q4_1", "smollm2-f16", "smollm2-q8_0", "smollm2-q2_0", "qwen3-small-f16", "qwen3-small-q1_0",
          "qwen3-small-q2_0", "qwen3-small-untied-f16", "qwen3-small-untied-q1_0", "qwen3-small-untied-q2_0",
          "llama-gqa-f16"]


def kernels(n: int, n_ubatch: int = 512) -> str:
    ks = []
    for s in range(0, n, n_ubatch):
        t = min(n_ubatch, n - s)
        ks.append(attention_order(t, max(256, -(-(s + t) // 256) * 256)).kernel.split("_")[-1])
    return "+".join(dict.fromkeys(ks))


def main() -> None:
    quick = "--quick" in sys.argv
    backend = "reference" if "--reference" in sys.argv else "llvm"
    prompts = [p for p in PROMPTS if not (quick and p == 600)]
    lines = ["# Oracle results", "",
             f"bankml {backend} backend vs llama.cpp b11434 (AVX2 build), {time.strftime('%Y-%m-%d')}, "
             f"{platform.machine()}; every logits row compared by sha256 of its f32 bytes.", "",
             "| model | prompt | outputs | attention kernel | rows identical / compared |", "|---|---|---|---|---|"]
    for name in MODELS:
        m = bankml.load(models.path(name), backend=backend, threads=2)
        for n in prompts:
            if n == 600 and name.startswith("smollm2") and name != "smollm2-q4_1":
                continue
            t = np.random.default_rng(n).integers(0, 49152, n).tolist()
            for outputs in ("all", "last"):
                ours = m.session().prefill(t, outputs=outputs)
                ref = oracle.logits(m.path, t, threads=2, outputs=outputs)
                same = sum(a == b for a, b in zip(oracle.sha256_rows(ours), oracle.sha256_rows(ref)))
                lines.append(f"| {name} | {n} | {outputs} | {kernels(n)} | {same} / {len(ref)} |")
                print(lines[-1], flush=True)
    for name, threads in (("qwen3-small-q1_0", 2), ("qwen3-small-q1_0", 3), ("smollm2-q4_1", 2)):
        m = bankml.load(models.path(name), backend=backend, threads=2, llama_threads=threads)
        s = m.session()
        prompt = np.random.default_rng(7).integers(0, 49152, 250).tolist()
        row = s.prefill(prompt, outputs="last")[-1]
        toks, rows = list(prompt), []
        while len(toks) < 300:
            toks.append(int(np.argmax(row)))
            row = s.decode(toks[-1])
            rows.append(row)
        ref = oracle.logits(m.path, toks, threads=threads, outputs="last", decode_from=250)[1:]
        same = sum(a == b for a, b in zip(oracle.sha256_rows(np.stack(rows)), oracle.sha256_rows(ref)))
        lines.append(f"| {name} (llama_threads {threads}) | 250 + 50 greedy decodes | 1 per decode | "
                     f"reference (≤256 cells), split (257+) | {same} / {len(ref)} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
