"""llama-completion's and llama-server's own timing reports, read from captured real output
(tests/data: `llama-completion -no-cnv --no-display-prompt --ignore-eos -n 16 --seed 42` on
SmolLM2 Q4_1, and a llama-server /v1/chat/completions answer), and llama-completion itself
against bankml's generation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bankml.errors import OracleError
from bankml.oracle.completion import completion, generated_text, perf_report
from bankml.oracle.server import chat_reply
from bankml.testing import models

DATA = Path(__file__).resolve().parents[1] / "data"


def test_perf_report_reads_every_common_perf_print_line():
    r = perf_report((DATA / "llama_completion_stderr.txt").read_text())
    assert r["eval_ms"] == 15700.62 and r["eval_n"] == 15
    assert r["prompt_eval_ms"] == 3232.64 and r["prompt_eval_n"] == 4
    assert r["sampling_ms"] == 2.12 and "sampling_n" not in r
    assert r["samplers_ms"] == 0.76 and r["samplers_n"] == 20
    assert r["load_ms"] == 4140.89 and r["total_ms"] == 18950.35 and r["total_n"] == 19
    assert round(r["eval_per_second"], 2) == 0.96 and round(r["prompt_per_second"], 2) == 1.24   # as printed


def test_perf_report_without_a_report_is_an_oracle_error():
    with pytest.raises(OracleError, match="no timing report"):
        perf_report("0.00.001.057 I llama_completion: llama backend init\n")


def test_generated_text_is_stdout_without_the_blank_line_before_the_report():
    text = generated_text((DATA / "llama_completion_stdout.txt").read_text())
    assert text == ", the ancient civilization of the Amazon had a powerful and powerful jungle. There was"
    assert generated_text("Hi! [end of text]\n\n\n") == "Hi!"


def test_chat_reply_reads_llama_servers_usage_and_timings():
    r = chat_reply(json.loads((DATA / "llama_server_chat.json").read_text()))
    assert r["text"] == "In the realm of color, there is" and r["finish_reason"] == "length"
    assert r["completion_tokens"] == 8 == r["predicted_n"] and r["prompt_tokens"] == 34
    assert r["predicted_ms"] == 579.791 and r["predicted_per_second"] == 12.073316074240545


def test_chat_reply_without_timings_is_an_oracle_error():
    body = json.loads((DATA / "llama_server_chat.json").read_text())
    del body["timings"]
    with pytest.raises(OracleError, match="timings"):
        chat_reply(body)


@pytest.mark.oracle
@pytest.mark.parametrize("temp", [0.0, None], ids=["greedy", "default-chain"])
def test_llama_completion_prints_bankmls_text(temp):
    """-no-cnv completes the raw text: the same tokens as bankml's generate on that text, greedy and
    the default chain with a seed (--ignore-eos on both sides)."""
    import bankml
    from bankml.runtime.generate import generate
    from bankml.runtime.sampler import GREEDY, SamplerParams
    from bankml.tokenizer import tokenizer_for
    path = models.path("smollm2-q4_1")
    r = completion(path, "Once upon a time", 16, temp=temp, seed=42, ignore_eos=True)
    assert r["perf"]["eval_n"] == 15 and r["wall_s"] > 0
    with bankml.load(path, threads=2) as m:
        ids = m.tokenize("Once upon a time", add_special=True, parse_special=True)
        toks = list(generate(m, ids, 16, GREEDY if temp == 0.0 else SamplerParams(), seed=42, ignore_eos=True))
        assert r["text"] == tokenizer_for(m).decode(toks, special=False)
