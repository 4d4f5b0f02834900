"""The measured bar: how far the portable profile's logits are from llama.cpp's.

    python -m bankml.testing.portable_bar MODEL [--positions 1000] [--prompts 20] [--tokens 64]
                                               [--backend llvm|reference] [--threads 2]

- max |Δ| of the logits and top-1 agreement over `positions` positions of a fixed English text
  (TEXT below, repeated as needed), one prefill with every row's logits on both sides;
- greedy agreement over `prompts` prompts (PROMPTS): llama-server (b11434, temperature 0)
  generates `tokens` tokens; the portable profile reads prompt + generation in one prefill and
  its greedy choice at each position is its argmax there (its prefill rows equal its decode
  rows, tests/runtime/test_portable_model.py), so the tokens it agrees on before its first
  different choice are exactly those its own greedy decode would share with llama.cpp's.
The portable side runs on the llvm backend by default; `backend="reference"` runs the numpy spec
itself. Both compute the same function, bit for bit: tests/runtime/test_portable_llvm.py holds
every logits row of llvm (1, 2 and 3 threads) to the sha256 of the reference backend's row on
SmolLM2 (Q4_1, F16, Q8_0, Q2_0) and Qwen3 (Q1_0, F16), for prefills across the micro-batch
edges, "all" and "last" outputs and decodes, and a decode to 1,100 cells on Qwen3 Q1_0 (the
reference's own prefill) and SmolLM2 Q4_1 (threads and one prefill agree); so the figures do not
depend on the backend, only the time does. Needs the llama.cpp oracle build.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

import numpy as np

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it "
    "was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything "
    "before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the "
    "other way. Four score and seven years ago our fathers brought forth on this continent, a new nation, "
    "conceived in Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged "
    "in a great civil war, testing whether that nation, or any nation so conceived and so dedicated, can long "
    "endure. The water cycle describes how water evaporates from the surface of the earth, rises into the "
    "atmosphere, cools and condenses into clouds, and falls again to the surface as precipitation. A compiler "
    "translates a program written in one language into another language, usually a lower level one that a "
    "machine can run. It reads the source, checks it, builds an intermediate representation, improves it "
    "with a series of passes, and finally emits code for the target. Photosynthesis is the process by which "
    "green plants and some other organisms use sunlight to synthesize foods from carbon dioxide and water. "
)

PROMPTS = [
    "The capital of France is", "Once upon a time, in a small village,", "The three primary colors are",
    "To make a cup of tea, first", "The theory of relativity was developed by", "My favourite recipe for bread",
    "The largest planet in our solar system is", "In computer science, a linked list is",
    "The quick brown fox", "Water boils at a temperature of", "The best way to learn a new language is",
    "Here is a short poem about the sea:", "The French Revolution began in", "A healthy breakfast includes",
    "The main difference between a virus and a bacterium is", "Python is a programming language that",
    "The sun rises in the east and", "Dear diary, today I", "The most important invention of the 20th century",
    "def fibonacci(n):",
]


@dataclass
class Bar:
    model: str
    positions: int
    max_abs_diff: float          # max |Δ| over every logit of every position
    top1_agreement: float        # share of positions whose argmax is llama.cpp's
    prompts: int
    tokens: int
    greedy_agreement: float      # tokens agreed before the first different choice / tokens generated
    greedy_identical: int        # prompts whose whole generation agrees


def text_tokens(m, n: int) -> list[int]:
    ids = m.tokenize(TEXT, add_special=True, parse_special=False)
    body = m.tokenize(TEXT, add_special=False, parse_special=False)
    while len(ids) < n:
        ids += body
    return ids[:n]


def measure(path, positions: int = 1000, prompts: int = 20, tokens: int = 64, threads: int = 2,
            backend: str = "llvm") -> Bar:
    import bankml
    from bankml import oracle
    from bankml.oracle.server import LlamaServer
    from bankml.profiles.portable.funcs import argmax
    with bankml.load(path, backend=backend, threads=threads, profile="portable",
                     n_ctx=max(positions, 256) + 256) as m:
        ids = text_tokens(m, positions)
        ref = oracle.logits(path, ids, threads=threads, outputs="all", n_ctx=m.n_ctx)
        got = m.session().prefill(ids, outputs="all")
        diff = float(np.max(np.abs(got.astype(np.float64) - ref)))
        top1 = float(np.mean(argmax(got) == np.argmax(ref, -1)))
        agreed, identical, generated = 0, 0, 0
        with LlamaServer(path, threads=threads) as srv:
            for text in PROMPTS[:prompts]:
                p = m.tokenize(text, add_special=True, parse_special=False)
                gen = srv.completion(p, tokens, temperature=0.0)
                rows = m.session().prefill(p + gen, outputs="all")[len(p) - 1:len(p) - 1 + len(gen)]
                same = argmax(rows) == np.asarray(gen)
                k = len(gen) if same.all() else int(np.argmin(same))
                agreed, generated = agreed + k, generated + len(gen)
                identical += int(k == len(gen))
    return Bar(str(path), positions, diff, top1, prompts, tokens, agreed / max(generated, 1), identical)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--positions", type=int, default=1000)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--backend", choices=("llvm", "reference"), default="llvm")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(asdict(measure(a.model, a.positions, a.prompts, a.tokens, a.threads, a.backend))), flush=True)
    sys.exit(0)
