"""A bounded load test: 200 requests from 16 concurrent clients on 2 slots, some disconnecting
mid-stream and some malformed. Every well-formed request gets its known answer, every bad one its
status code, a full queue 503, the log no error, and the server's RSS ends near where it began."""
from __future__ import annotations

import asyncio
import random

import httpx
import pytest

PROMPTS = ["Once upon a time", "The capital of France is", "def fib(n):", "1, 2, 3, 4,"]
N = 6


def body(i: int, stream: bool = False) -> dict:
    # cache_prompt off: each answer is a fresh prefill, so it is the same bits whatever ran before
    return {"prompt": PROMPTS[i % 4], "max_tokens": N, "temperature": 0, "cache_prompt": False, "stream": stream}


@pytest.mark.server
def test_200_requests_16_clients(bankml_server_factory):
    srv = bankml_server_factory("qwen3-small-q1_0", "--parallel", "2", "--queue", "16", "--ctx", "256",
                                "--threads", "1", "--cache-ram", "64")
    want = {i: httpx.post(srv.url + "/v1/completions", json=body(i)).json()["choices"][0]["text"] for i in range(4)}
    for _ in range(8):                              # warm up, then measure
        httpx.post(srv.url + "/v1/completions", json=body(0, stream=False))
    rss0 = srv.rss_kib()
    counts = {"ok": 0, "refused": 0, "dropped": 0}

    async def one(client: httpx.AsyncClient, k: int) -> None:
        kind = k % 10
        if kind == 7:                               # malformed JSON -> 400
            r = await client.post("/v1/completions", content=b'{"prompt": ')
            assert r.status_code == 400 and r.json()["error"]["code"] == 400
            counts["refused"] += 1
        elif kind == 8:                             # wrong field type / too long prompt -> 400
            bad = {"prompt": "x", "max_tokens": "many"} if k % 20 == 8 else {"prompt": "a " * 400}
            r = await client.post("/v1/completions", json=bad)
            assert r.status_code == 400, r.text
            counts["refused"] += 1
        elif kind == 9:                             # leaves mid-stream
            async with client.stream("POST", "/v1/completions", json={**body(k), "max_tokens": 64, "stream": True}) as r:
                assert r.status_code == 200
                async for _ in r.aiter_lines():
                    break
            counts["dropped"] += 1
        else:
            stream = kind % 2 == 1
            if stream:
                text = ""
                async with client.stream("POST", "/v1/completions", json=body(k, True)) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            text += httpx.Response(200, content=line[6:]).json()["choices"][0]["text"]
            else:
                r = await client.post("/v1/completions", json=body(k))
                assert r.status_code == 200, r.text
                text = r.json()["choices"][0]["text"]
            assert text == want[k % 4], k
            counts["ok"] += 1

    async def main() -> None:
        jobs = list(range(200))
        random.Random(0).shuffle(jobs)
        queue: asyncio.Queue = asyncio.Queue()
        for k in jobs:
            queue.put_nowait(k)

        async def client_loop() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
                while not queue.empty():
                    await one(client, queue.get_nowait())
        await asyncio.gather(*(client_loop() for _ in range(16)))

    asyncio.run(main())
    assert counts == {"ok": 140, "refused": 40, "dropped": 20}
    slots = httpx.get(srv.url + "/slots").json()
    assert not any(s["is_processing"] for s in slots)
    assert "Traceback" not in srv.log() and "failed" not in srv.log()
    assert srv.rss_kib() < rss0 + 64 * 1024, (rss0, srv.rss_kib())


@pytest.mark.server
def test_full_queue_answers_503(bankml_server_factory):
    srv = bankml_server_factory("qwen3-small-q1_0", "--parallel", "1", "--queue", "1", "--ctx", "256",
                                "--threads", "1")

    async def main():
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
            long = {"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0}
            rs = await asyncio.gather(*(client.post("/v1/completions", json=long) for _ in range(4)))
            return [r.status_code for r in rs], rs
    codes, rs = asyncio.run(main())
    assert sorted(codes) == [200, 200, 503, 503], codes
    busy = next(r for r in rs if r.status_code == 503).json()["error"]
    assert busy["type"] == "unavailable_error" and busy["code"] == 503
    assert httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
