"""Does llama-server's batch change a request's bits? Four greedy /completion requests (n_probs 3,
32 tokens, cache_prompt off) sent to `llama-server -np 1` one at a time and to `llama-server -np 4`
all at once; per request: whether the text is the same and how many of its printed logprobs
(each token's and its top 3) differ. `bankml serve --parallel N` gives every request its -np 1
bits (tests/server/test_batched_slots.py); docs/SERVER.md quotes this script's output.

    python bench/batch_variance.py [--models smollm2-f16,smollm2-q4_1]
"""
from __future__ import annotations

import argparse
import asyncio

import httpx

from bankml.oracle.server import LlamaServer
from bankml.testing import models

PROMPTS = ["Once upon a time", "The capital of France is", "def fib(n):", "1, 2, 3, 4,"]


def body(i: int) -> dict:
    return {"prompt": PROMPTS[i], "n_predict": 32, "temperature": 0, "n_probs": 3, "cache_prompt": False}


def answer(r: dict) -> tuple[str, list[float]]:
    return r["content"], [p for t in r["completion_probabilities"]
                          for p in [t["logprob"]] + [x["logprob"] for x in t["top_logprobs"]]]


async def together(url: str) -> list[tuple[str, list[float]]]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        return [answer(r.json()) for r in await asyncio.gather(*(c.post("/completion", json=body(i))
                                                                 for i in range(len(PROMPTS))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-f16,smollm2-q4_1")
    for model in ap.parse_args().models.split(","):
        with LlamaServer(models.path(model), threads=2, n_ctx=4096) as one:
            alone = [answer(httpx.post(one.url + "/completion", json=body(i), timeout=300).json())
                     for i in range(len(PROMPTS))]
        with LlamaServer(models.path(model), threads=2, n_ctx=4096 * 4, extra=("-np", "4")) as four:
            batched = asyncio.run(together(four.url))
        for i, ((text_a, lp_a), (text_b, lp_b)) in enumerate(zip(alone, batched)):
            diff = [(a, b) for a, b in zip(lp_a, lp_b) if a != b]
            example = f"; first: {diff[0][0]!r} alone, {diff[0][1]!r} batched" if diff else ""
            print(f"{model} request {i}: {'same text' if text_a == text_b else 'text differs'}, "
                  f"{len(diff)}/{len(lp_a)} logprobs differ{example}", flush=True)


if __name__ == "__main__":
    main()
