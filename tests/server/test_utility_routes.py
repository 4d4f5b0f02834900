"""/tokenize, /detokenize and /apply-template against llama-server b11434: the same JSON for the
same request, on a BPE vocabulary (SmolLM2, its chat template) and a SentencePiece one with byte
pieces (Gemma 3, its template)."""
from __future__ import annotations

import httpx
import pytest

from bankml.oracle.server import LlamaServer
from bankml.testing import models
from bankml.testing.serve import BankmlServer

TEXTS = ["Hello, world!", " leading space and  two", "naïve café — 東京 🦙🦙", "<|im_start|>user\nhi<|im_end|>",
         "<start_of_turn>model\nok<end_of_turn>", "", "\n\n\t x"]
TOKENIZE = [{"content": t, **flags} for t in TEXTS for flags in (
    {}, {"add_special": True}, {"parse_special": False}, {"with_pieces": True},
    {"add_special": True, "parse_special": False, "with_pieces": True})] + [
    {"content": ["Hello", 42, " world", 7.9]},                       # mixed: ids as given, a float's integer part
    {"content": [5, "Hello"], "add_special": True},                 # the first element is no string: no BOS
    {"content": ["A", "B"], "add_special": True, "with_pieces": True},
    {"content": "Hi", "add_special": "yes", "with_pieces": 1},      # flags of another type: their defaults
    {"content": "Hi", "parse_special": None},
    {},                                                             # no content: no tokens
]
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
     {"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}]}],
]


@pytest.fixture(scope="module", params=["smollm2-q4_1", "gemma3-270m-q4_k_m"])
def pair(request):
    with BankmlServer(request.param, threads=1) as ours, LlamaServer(models.path(request.param), threads=1) as theirs:
        yield ours.url, theirs.url


def both(pair, path: str, body: dict) -> tuple[httpx.Response, httpx.Response]:
    return tuple(httpx.post(url + path, json=body, timeout=60) for url in pair)


@pytest.mark.oracle
@pytest.mark.server
def test_tokenize_answers_as_llama_server(pair):
    for body in TOKENIZE:
        ours, theirs = both(pair, "/tokenize", body)
        assert theirs.status_code == 200, (body, theirs.text)
        assert ours.status_code == 200 and ours.json() == theirs.json(), body


@pytest.mark.oracle
@pytest.mark.server
def test_detokenize_answers_as_llama_server(pair):
    ids = httpx.post(pair[1] + "/tokenize", json={"content": " ".join(TEXTS), "add_special": True}).json()["tokens"]
    for body in ({"tokens": ids}, {"tokens": ids[:3]}, {"tokens": []}, {}, {"tokens": [ids[0], 3.7]}):
        ours, theirs = both(pair, "/detokenize", body)
        assert theirs.status_code == 200, theirs.text
        assert ours.status_code == 200 and ours.json() == theirs.json(), body


@pytest.mark.oracle
@pytest.mark.server
def test_apply_template_answers_as_llama_server(pair):
    named = [{"role": "user", "content": "Hi", "name": "ann"}, {"role": "assistant", "content": "Hello.",
                                                                 "reasoning_content": "greet"},
             {"role": "tool", "content": "42", "tool_call_id": "c1"}, {"role": "user", "content": "and?"}]
    user, prefix = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure, here:"}
    continued = [[user, prefix], [user], [{"role": "system", "content": "S"}, user, {"role": "assistant", "content": ""}],
                 [{"role": "developer", "content": "Be brief."}, user], [prefix, prefix],
                 [user, {"role": "assistant", "content": "", "reasoning_content": "thinking"}]]
    for messages in [*CONVERSATIONS, named, *continued]:
        for flags in ({}, {"add_generation_prompt": False}, {"continue_final_message": True},
                      {"continue_final_message": True, "add_generation_prompt": False},
                      {"continue_final_message": "reasoning_content", "add_generation_prompt": False}):
            ours, theirs = both(pair, "/apply-template", {"messages": messages, **flags})
            assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json()), (messages, flags)


@pytest.mark.oracle
@pytest.mark.server
def test_utility_routes_refuse_what_llama_server_refuses(pair):
    """A content or tokens field of the wrong type: llama-server's 400 and nlohmann's message."""
    for path, body in (("/tokenize", {"content": 5}), ("/tokenize", {"content": ["a", None]}),
                       ("/detokenize", {"tokens": "abc"}), ("/detokenize", {"tokens": [1, "x"]}),
                       ("/apply-template", {})):
        ours, theirs = both(pair, path, body)
        assert theirs.status_code == 400 and ours.status_code == 400, (path, body, theirs.text, ours.text)
        if path != "/apply-template":
            assert ours.json()["error"]["message"] == theirs.json()["error"]["message"]
    ours = httpx.post(pair[0] + "/detokenize", json={"tokens": [10**7]})
    assert ours.status_code == 400 and "invalid token id 10000000" in ours.json()["error"]["message"]
