"""Embeddings against llama-server b11434 --embeddings --pooling P: the same JSON (so the same f32
vectors, bit for bit) on /v1/embeddings, /embedding and /embeddings for inputs shorter and longer
than one 32-wide step of ggml_vec_dot_f32, lists of inputs, token ids, every embd_normalize, base64;
the same refusals. The official clients drive it; without --embeddings it is llama-server's 501."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from bankml.oracle.server import LlamaServer
from bankml.numerics.vec import vec_dot_f32
from bankml.runtime.embeddings import normalize, pool
from bankml.testing import models
from bankml.testing.serve import BankmlServer

SHORT = "Hello world"
LONG = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest. " * 3
LONGER = "A sentence about embeddings, vectors and pooling, repeated. " * 24
CASES = [
    ("/v1/embeddings", {"input": SHORT}), ("/v1/embeddings", {"input": LONG, "model": "any-name"}),
    ("/v1/embeddings", {"input": [SHORT, LONGER, "x"]}), ("/v1/embeddings", {"input": [1, 2, 3, 40, 50]}),
    ("/v1/embeddings", {"input": [[5, 6, 7], "mixed ids"]}), ("/v1/embeddings", {"input": LONG, "encoding_format": "base64"}),
    ("/embedding", {"content": LONG}), ("/embeddings", {"content": [SHORT, LONG]}),
    *[("/embedding", {"content": LONG, "embd_normalize": n}) for n in (-1, 0, 3)],
]
REFUSED = [("/v1/embeddings", {"input": ""}), ("/v1/embeddings", {"input": "word " * 600}),   # "last" may split
           ("/v1/embeddings", {}), ("/v1/embeddings", {"input": SHORT, "encoding_format": "int8"})]


def both(pair, path: str, body: dict) -> tuple[httpx.Response, httpx.Response]:
    return tuple(httpx.post(url + path, json=body, timeout=120) for url in pair)


def _start(model: str, pooling: str):
    return (BankmlServer(model, "--embeddings", "--pooling", pooling, threads=2),
            LlamaServer(models.path(model), threads=2, extra=("--embeddings", "--pooling", pooling)))


@pytest.mark.oracle
@pytest.mark.server
@pytest.mark.parametrize("model,pooling", [("smollm2-q4_1", "mean"), ("smollm2-q4_1", "last"), ("smollm2-q4_1", "cls"),
                                           ("gemma3-270m-q4_k_m", "mean")])
def test_embeddings_equal_llama_servers(model, pooling):
    ours, theirs = _start(model, pooling)
    with ours, theirs:
        pair = (ours.url, theirs.url)
        for path, body in CASES + REFUSED:
            got, want = both(pair, path, body)
            assert want.status_code == 200 or (path, body) in REFUSED, want.text
            g, w = got.json(), want.json()
            if path == "/v1/embeddings" and "model" not in body and want.status_code == 200:
                # bankml names its model by the file's name, llama-server by its path
                assert g.pop("model") == models.path(model).name and w.pop("model") == str(models.path(model))
            assert (got.status_code, g) == (want.status_code, w), (path, body)


@pytest.mark.oracle
@pytest.mark.server
def test_pooling_none_gives_each_tokens_row_and_refuses_openai():
    ours, theirs = _start("smollm2-q4_1", "none")
    with ours, theirs:
        pair = (ours.url, theirs.url)
        for path, body in (("/embedding", {"content": LONG}), ("/embedding", {"content": SHORT, "embd_normalize": 0}),
                           ("/v1/embeddings", {"input": SHORT})):
            got, want = both(pair, path, body)
            assert (got.status_code, got.json()) == (want.status_code, want.json()), (path, body)


@pytest.mark.oracle
@pytest.mark.server
def test_the_clients_embed():
    import ollama
    import openai
    ours, theirs = _start("smollm2-q4_1", "mean")
    with ours, theirs:
        oai = openai.OpenAI(base_url=ours.url + "/v1", api_key="none", max_retries=0)
        got = oai.embeddings.create(model="m", input=[SHORT, LONG])
        want = httpx.post(theirs.url + "/v1/embeddings", json={"input": [SHORT, LONG]}).json()
        assert [d.embedding for d in got.data] == [d["embedding"] for d in want["data"]]
        assert got.usage.prompt_tokens == want["usage"]["prompt_tokens"]
        r = ollama.Client(host=ours.url).embed(model="m", input=[SHORT, LONG])
        assert r.embeddings == [d["embedding"] for d in want["data"]] and r.prompt_eval_count == got.usage.prompt_tokens


@pytest.mark.server
def test_without_the_flag_embeddings_are_llama_servers_501(bankml_server_factory):
    srv = bankml_server_factory("smollm2-q4_1")
    for path in ("/v1/embeddings", "/embedding"):
        r = httpx.post(srv.url + path, json={"input": SHORT}, timeout=60)
        assert r.status_code == 501 and "Start it with `--embeddings`" in r.json()["error"]["message"]


@pytest.mark.oracle
@pytest.mark.parametrize("n", [1, 5, 31, 32, 33, 64, 100, 301])
def test_vec_dot_f32_equals_ggmls(n):
    """Mean pooling's dot products against ggml_vec_dot_f32 of the oracle build (through ctypes):
    values whose sum depends on the order, at lengths around the 32-wide step."""
    import ctypes

    from bankml.oracle import ggml
    fn = ggml.VEC_DOT(ggml.lib().ggml_get_type_traits_cpu(0).contents.vec_dot)
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((6, n)) * np.exp(rng.uniform(-8, 8, (6, n)))).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    got = vec_dot_f32(x, y)
    for r in range(6):
        s = ctypes.c_float()
        fn(n, ctypes.byref(s), 0, x[r].ctypes.data, 0, y.ctypes.data, 0, 1)
        assert got[r].tobytes() == np.float32(s.value).tobytes(), (n, r)
    rows = x.T.copy()
    assert np.array_equal(pool(rows, "last"), rows[-1]) and np.array_equal(pool(rows, "cls"), rows[0])


def test_normalize_is_common_embd_normalize():
    v = np.array([3.0, -4.0, 0.5], np.float32)
    assert np.array_equal(normalize(v, -1), v)
    assert normalize(v, 2).tolist() == (v * np.float32(1.0 / np.sqrt(9.0 + 16.0 + 0.25))).tolist()
    assert normalize(v, 0).tolist() == (v * np.float32(1.0 / (4.0 / 32760.0))).tolist()
    assert normalize(np.zeros(3, np.float32), 2).tolist() == [0.0, 0.0, 0.0]
