"""Request fields as llama-server b11434's schema reads them (bankml/server/fields.py), and Ollama's
options (bankml/server/api/ollama.py): pure parsing, no model."""
from __future__ import annotations

import math

import pytest

from bankml.server import fields as F
from bankml.server.api import ollama
from bankml.server.fields import BadRequest, Vocab


def vocab() -> Vocab:
    """100 ids; EOG 0 and 2; a text tokenizes to its characters' codes mod 100."""
    return Vocab(100, eog=[2, 0], tokenize=lambda s: [ord(c) % 100 for c in s])


def kw(body: dict, **opts) -> dict:
    return F.sampling_kwargs(body, vocab(), **opts)


def refused(body: dict, status: int = 400) -> str:
    with pytest.raises(BadRequest) as e:
        F.job_fields(body, vocab())
    assert e.value.status == status, e.value
    return str(e.value)


def test_defaults_are_common_params_sampling():
    k = kw({})
    assert (k["temp"], k["top_k"], k["top_p"], k["min_p"], k["repeat_last_n"], k["dry_base"]) == (0.8, 40, 0.95, 0.05, 64, 1.75)
    assert k["samplers"] == ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
    assert k["logit_bias"] == () and k["dry_sequence_breakers"] == ("\n", ":", "\"", "*")


def test_every_field_lands_in_its_sampler_param():
    body = {"temperature": 0.5, "dynatemp_range": 0.25, "dynatemp_exponent": 2, "top_k": 7, "top_p": 0.5,
            "min_p": 0.25, "typical_p": 0.5, "top_n_sigma": 1.5, "xtc_probability": 0.5, "xtc_threshold": 0.25,
            "repeat_last_n": 32, "repeat_penalty": 1.5, "frequency_penalty": 0.5, "presence_penalty": 0.25,
            "dry_multiplier": 0.5, "dry_base": 2, "dry_allowed_length": 3, "dry_penalty_last_n": 16,
            "mirostat": 2, "mirostat_tau": 4, "mirostat_eta": 0.5, "min_keep": 2, "dry_sequence_breakers": ["x"]}
    k = kw(body)
    want = dict(temp=0.5, dynatemp_range=0.25, dynatemp_exponent=2.0, top_k=7, top_p=0.5, min_p=0.25, typical_p=0.5,
                top_n_sigma=1.5, xtc_probability=0.5, xtc_threshold=0.25, repeat_last_n=32, repeat_penalty=1.5,
                frequency_penalty=0.5, presence_penalty=0.25, dry_multiplier=0.5, dry_base=2.0, dry_allowed_length=3,
                dry_penalty_last_n=16, mirostat=2, mirostat_tau=4.0, mirostat_eta=0.5, min_keep=2,
                dry_sequence_breakers=("x",))
    assert {n: k[n] for n in want} == want


def test_soft_limits_clamp():
    k = kw({"temperature": -1, "top_k": -5, "top_p": 2, "min_p": -1, "xtc_probability": 3, "xtc_threshold": -1,
            "mirostat": 7})
    assert (k["temp"], k["top_k"], k["top_p"], k["min_p"], k["xtc_probability"], k["xtc_threshold"], k["mirostat"]) == \
        (0.0, 0, 1.0, 0.0, 1.0, 0.0, 2)


def test_floats_round_to_float32_and_integers_truncate_and_wrap():
    k = kw({"top_p": 0.9, "top_k": 5.9, "repeat_last_n": 2**32 + 3})
    assert k["top_p"] == 0.8999999761581421 and k["top_k"] == 5 and k["repeat_last_n"] == 3


@pytest.mark.parametrize("name", ["repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "min_keep"])
def test_hard_limits_refuse_negative(name):
    assert refused({name: -1}) == f"Field '{name}': Value must be between 0 <= value <= 2147483647, but got -1"


def test_dry_base_below_one_takes_the_default():
    assert kw({"dry_base": 0.5})["dry_base"] == 1.75 and kw({"dry_base": 3})["dry_base"] == 3.0


@pytest.mark.parametrize("v", [[], "x", [1], {"a": 1}])
def test_dry_sequence_breakers_must_be_strings(v):
    assert refused({"dry_sequence_breakers": v}) == \
        "Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings"


def test_wrong_type_names_the_field():
    assert refused({"repeat_penalty": "x"}) == \
        "Field 'repeat_penalty': [json.exception.type_error.302] type must be number, but is string"


@pytest.mark.parametrize("v", [0, -1, 1e-40, 1e39])
def test_repeat_penalty_must_be_finite_and_positive(v):
    assert refused({"repeat_penalty": v}) == "Failed to initialize samplers: penalty_repeat must be finite and greater than 0"


def test_logit_bias_pairs_strings_and_false():
    k = kw({"logit_bias": [[5, 1.5], [500, 1], [-1, 1], ["ab", False], [7, True], [7], "x", [8.0, 1]]})
    assert k["logit_bias"] == ((5, 1.5), (97, -math.inf), (98, -math.inf))


def test_logit_bias_object_keys_read_by_strtol():
    k = kw({"logit_bias": {"5": -2, " 6": 1, "+7": 1, "": 3, "12x": 1, "300": 1, "9": True}})
    assert k["logit_bias"] == ((5, -2.0), (6, 1.0), (7, 1.0), (0, 3.0), (49, 1.0), (50, 1.0), (20, 1.0))


def test_ignore_eos_bans_each_eog_after_the_bias():
    k = kw({"logit_bias": [[5, 1]], "ignore_eos": True})
    assert k["logit_bias"] == ((5, 1.0), (0, -math.inf), (2, -math.inf))


def test_samplers_by_name_alias_and_char():
    assert kw({"samplers": ["Top-K", "nucleus", "temp", "minp", "bogus"]})["samplers"] == \
        ("top_k", "top_p", "temperature", "min_p")
    assert kw({"samplers": "edkypmxt?"})["samplers"] == \
        ("penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
    assert refused({"samplers": ["top_k", 3]}) == \
        "Field 'samplers': [json.exception.type_error.302] type must be string, but is number"


def test_n_probs_and_its_logprobs_alias():
    assert F.probs_fields({"n_probs": 3, "logprobs": 9}) == {"n_probs": 3, "post_sampling_probs": False}
    assert F.probs_fields({"logprobs": 4, "post_sampling_probs": True}) == {"n_probs": 4, "post_sampling_probs": True}
    assert F.probs_fields({"logprobs": True})["n_probs"] == 1


def test_chat_logprobs_asks_top_logprobs_default_20():
    assert F.chat_logprobs({"logprobs": True})["n_probs"] == 20
    assert F.chat_logprobs({"logprobs": True, "top_logprobs": 3, "n_probs": 9})["n_probs"] == 3
    assert "n_probs" not in F.chat_logprobs({"logprobs": False})
    with pytest.raises(BadRequest, match="top_logprobs requires logprobs to be set to true"):
        F.chat_logprobs({"top_logprobs": 2})


def test_adaptive_p_is_parsed_and_refused_only_when_on():
    assert refused({"adaptive_decay": 1}) == \
        "Field 'adaptive_decay': Value must be between 0.000000 <= value <= 0.990000, but got 1.000000"
    F.job_fields({"adaptive_target": -0.5})
    refused({"adaptive_target": 0.5}, 501)


def test_ollama_options_take_ollamas_defaults():
    p = ollama.options_fields({"options": {"num_predict": 4}})
    assert p["n_predict"] == 4
    got = p["params"]
    assert (got.top_p, got.min_p, got.top_k, got.temp) == (F.c_float(0.9), 0.0, 40, F.c_float(0.8))


def test_ollama_options_map_to_llama_server_fields():
    p = ollama.options_fields({"options": {"temperature": 0, "top_p": 0.5, "seed": 7, "stop": ["x"], "num_keep": 3,
                                           "unknown": "ignored"}})
    assert (p["params"].temp, p["params"].top_p, p["seed"], p["stop"]) == (0.0, 0.5, 7, ["x"])


def test_ollama_repeat_last_n_minus_one_is_the_context():
    """Ollama documents -1 as num_ctx; llama.cpp has no such value (a negative last_n is off), so
    the slot's context size is passed."""
    p = ollama.options_fields({"options": {"repeat_last_n": -1}}, n_ctx=2048)
    assert p["params"].repeat_last_n == 2048
    with pytest.raises(BadRequest, match="Value must be between 0"):
        ollama.options_fields({"options": {"repeat_last_n": -2}})


@pytest.mark.parametrize("opt, v, msg", [("num_predict", "x", 'option "num_predict" must be of type integer'),
                                          ("temperature", True, 'option "temperature" must be of type float32'),
                                          ("stop", "x", 'option "stop" must be of type array'),
                                          ("stop", [1], 'option "stop" must be of an array of strings')])
def test_ollama_option_types_as_ollama_checks_them(opt, v, msg):
    with pytest.raises(BadRequest, match=msg):
        ollama.options_fields({"options": {opt: v}})


def test_a_setting_of_a_sampler_that_is_off_is_never_refused():
    for body in [{"repeat_last_n": 32}, {"dry_base": 2.5, "dry_allowed_length": 4}, {"mirostat_tau": 3}]:
        F.job_fields(body, vocab())


def test_token_text_drops_only_a_character_cut_off_at_the_end():
    """validate_utf8: the token's text leaves out an unfinished multi-byte character at its end
    (its bytes keep it); it looks back up to four bytes, past ASCII too, as llama-server's does."""
    from bankml.server.engine import valid_utf8_len
    assert [valid_utf8_len(b) for b in (b"ab\xc3", b"\xc3\xa9", b"\xe2a", b"\xf0\x9f\x98", b"x\xf0\x9f\x98\x80")] == \
        [2, 2, 0, 0, 5]
