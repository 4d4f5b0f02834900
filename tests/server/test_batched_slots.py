"""`bankml serve --parallel 8`: concurrent requests share decode steps (continuous batching,
server/steps.py) and each still gets its solo bits. Eight seeded requests with n_probs, sent at
once in several arrival orders (shuffled, staggered), each give the tokens and the probabilities
(the JSON numbers, compared exactly) that llama-server -np 1 gives the same request alone;
/metrics shows the steps were shared; a client that leaves mid-stream stops its slot's
generation at the next step while the others go on to their solo answers. On SmolLM2 F16 too,
where llama-server's own -np 8 would change the bits (bench/batch_variance.py, docs/SERVER.md)."""
from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

pytestmark = pytest.mark.oracle

PROMPTS = ["Once upon a time", "The capital of France is", "def fib(n):", "1, 2, 3, 4,",
           "The cat sat on the mat. The cat sat on the", "Dear Sir,", "In 1492", "Water boils at"]


def body(i: int) -> dict:
    return {"prompt": PROMPTS[i], "n_predict": 24, "temperature": 0.8, "seed": 100 + i, "n_probs": 3,
            "cache_prompt": False}


def answer(r: dict) -> tuple:
    return r["content"], r["completion_probabilities"]


@pytest.fixture(scope="module", params=["smollm2-q4_1", "smollm2-f16"])
def pair(request):
    with BankmlServer(request.param, "--parallel", "8", "--llama-threads", "2", "--metrics", threads=2) as ours, \
            LlamaServer(models.path(request.param), threads=2) as theirs:
        yield ours, theirs


async def _concurrent(url: str, order: list[int], delays: list[float]) -> dict[int, dict]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        async def one(i: int, delay: float) -> tuple[int, dict]:
            await asyncio.sleep(delay)
            r = await client.post("/completion", json=body(i))
            assert r.status_code == 200, r.text
            return i, r.json()
        return dict(await asyncio.gather(*(one(i, d) for i, d in zip(order, delays))))


def test_eight_concurrent_requests_get_their_solo_bits_in_any_arrival_order(pair, record):
    ours, theirs = pair
    alone = {i: answer(httpx.post(theirs.url + "/completion", json=body(i), timeout=120).json()) for i in range(8)}
    rng = random.Random(0)
    for k in range(4):
        order = list(range(8))
        rng.shuffle(order)
        delays = [0.0] * 8 if k == 0 else [rng.uniform(0, 0.3) for _ in range(8)]
        got = asyncio.run(_concurrent(ours.url, order, delays))
        for i in range(8):
            assert answer(got[i]) == alone[i], f"request {i}, arrival order {order}"
    record(kind="server-batched", model=theirs.model, compared=32, identical=32)
    metrics = httpx.get(ours.url + "/metrics").text
    per_decode = float(next(line.split()[1] for line in metrics.splitlines()
                            if line.startswith("llamacpp:n_busy_slots_per_decode")))
    assert per_decode > 2, metrics           # the slots' tokens went through shared steps


def test_a_client_that_leaves_stops_its_slot_and_the_others_keep_their_answers(pair):
    ours, theirs = pair
    alone = {i: answer(httpx.post(theirs.url + "/completion", json=body(i), timeout=120).json()) for i in (1, 2)}

    async def main() -> dict:
        async with httpx.AsyncClient(base_url=ours.url, timeout=300) as client:
            async def leaver() -> None:
                long = {"prompt": PROMPTS[0], "n_predict": 2000, "temperature": 0, "stream": True, "ignore_eos": True}
                async with client.stream("POST", "/completion", json=long) as r:
                    n = 0
                    async for line in r.aiter_lines():
                        n += line.startswith("data: ")
                        if n == 5:
                            break                   # gone after 5 tokens

            async def stayer(i: int) -> tuple[int, dict]:
                r = await client.post("/completion", json=body(i))
                return i, r.json()
            results = await asyncio.gather(leaver(), stayer(1), stayer(2))
            return dict(results[1:])
    got = asyncio.run(main())
    assert {i: answer(got[i]) for i in (1, 2)} == alone
    for _ in range(100):                            # the slot stops at its next step: nobody is processing
        slots = httpx.get(ours.url + "/slots").json()
        if not any(s["is_processing"] for s in slots):
            break
        asyncio.run(asyncio.sleep(0.05))
    assert not any(s["is_processing"] for s in slots)
    left = [s for s in slots if s.get("params", {}).get("n_predict") == 2000]
    assert len(left) == 1 and left[0]["n_prompt_tokens"] < 40, left      # its cells: the prompt and a few tokens
