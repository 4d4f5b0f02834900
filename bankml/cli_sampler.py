"""`bankml run`'s sampler flags: llama-cli's names, defaults and checks (common/arg.cpp, b11434).

    @sampler_options
    def run(..., **sampling): params = sampler_params(sampling, model)

Each flag sets the SamplerParams field of the same meaning.
As in arg.cpp: --temp clamps to >= 0, --dry-base below 1 is ignored, --repeat-last-n and
--dry-penalty-last-n refuse a negative value, --repeat-penalty must be finite and above 0, the
presence and frequency penalties finite; --dry-sequence-breaker replaces the default breakers
(each use adds one; "none" clears them); -l/--logit-bias takes TOKEN_ID+BIAS or TOKEN_ID-BIAS;
--samplers names the chain's order separated by ';', --sampling-seq by characters. --min-keep is
llama-server's min_keep (llama-cli has no flag for it).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import click

from bankml.runtime.sampler import LLAMA_DEFAULTS, SamplerParams, c_float

D = LLAMA_DEFAULTS


class _Float(click.ParamType):
    """std::stof: a decimal or hex float, inf or nan."""
    name = "N"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            return float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number", param, ctx)


FLOAT = _Float()
_BIAS = re.compile(r"\s*([+-]?\d+)([+-])(.*)")

# (flags, SamplerParams field, type, help) in llama-cli's order
FLAGS = [
    (("--samplers",), "samplers", str, "The chain's samplers in order, separated by ';' (e.g. top_k;top_p;temperature)."),
    (("--sampler-seq", "--sampling-seq"), "samplers_seq", str, "The chain as characters (e.g. edskypmxt)."),
    (("--top-nsigma", "--top-n-sigma"), "top_n_sigma", FLOAT, f"Top-n-sigma (default {D['top_n_sigma']}; -1 off)."),
    (("--xtc-probability",), "xtc_probability", FLOAT, f"XTC probability (default {D['xtc_probability']}; 0 off)."),
    (("--xtc-threshold",), "xtc_threshold", FLOAT, f"XTC threshold (default {D['xtc_threshold']}; above 0.5 off)."),
    (("--typical", "--typical-p"), "typical_p", FLOAT, f"Locally typical p (default {D['typical_p']}; 1 off)."),
    (("--repeat-last-n",), "repeat_last_n", int, f"Last tokens the penalties see (default {D['repeat_last_n']}; 0 off)."),
    (("--repeat-penalty",), "repeat_penalty", FLOAT, f"Repeat penalty (default {D['repeat_penalty']}; 1 off)."),
    (("--presence-penalty",), "presence_penalty", FLOAT, f"Presence penalty (default {D['presence_penalty']})."),
    (("--frequency-penalty",), "frequency_penalty", FLOAT, f"Frequency penalty (default {D['frequency_penalty']})."),
    (("--dry-multiplier",), "dry_multiplier", FLOAT, f"DRY multiplier (default {D['dry_multiplier']}; 0 off)."),
    (("--dry-base",), "dry_base", FLOAT, f"DRY base (default {D['dry_base']}; below 1 ignored)."),
    (("--dry-allowed-length",), "dry_allowed_length", int, f"DRY allowed length (default {D['dry_allowed_length']})."),
    (("--dry-penalty-last-n",), "dry_penalty_last_n", int,
     f"Last tokens DRY scans (default {D['dry_penalty_last_n']}; 0 off)."),
    (("--dynatemp-range",), "dynatemp_range", FLOAT, f"Dynamic temperature range (default {D['dynatemp_range']})."),
    (("--dynatemp-exp",), "dynatemp_exponent", FLOAT, f"Dynamic temperature exponent (default {D['dynatemp_exponent']})."),
    (("--mirostat",), "mirostat", int, "Mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0."),
    (("--mirostat-lr",), "mirostat_eta", FLOAT, f"Mirostat learning rate eta (default {D['mirostat_eta']})."),
    (("--mirostat-ent",), "mirostat_tau", FLOAT, f"Mirostat target entropy tau (default {D['mirostat_tau']})."),
    (("--min-keep",), "min_keep", int, "Tokens each sampler keeps at least (llama-server's min_keep)."),
]


def sampler_options(fn):
    """The flags above, plus --dry-sequence-breaker and -l/--logit-bias (repeatable); each lands in
    the command's keyword arguments as s_<field>."""
    fn = click.option("-l", "--logit-bias", "s_logit_bias", multiple=True, metavar="TOKEN_ID(+/-)BIAS",
                      help="Add BIAS to a token's logit, e.g. 15043+1 or 15043-1 (repeatable).")(fn)
    fn = click.option("--dry-sequence-breaker", "s_dry_sequence_breakers", multiple=True, metavar="STRING",
                      help="A DRY sequence breaker, replacing the defaults (repeatable; 'none' for none).")(fn)
    for flags, name, kind, help_ in reversed(FLAGS):
        fn = click.option(*flags, f"s_{name}", type=kind, default=None, help=help_)(fn)
    return fn


def _bad(flag: str, why: str):
    return click.BadParameter(why, param_hint=flag)


def _logit_bias(values) -> tuple[tuple[int, float], ...]:
    out = []
    for v in values:
        m = _BIAS.fullmatch(v)
        try:
            bias = float(m.group(3)) * (-1.0 if m.group(2) == "-" else 1.0) if m else None
        except ValueError:
            bias = None
        if bias is None:
            raise _bad("--logit-bias", f"{v!r}: invalid input format (want TOKEN_ID+BIAS or TOKEN_ID-BIAS)")
        out.append((int(m.group(1)), c_float(bias)))
    return tuple(out)


def _samplers(names: str | None, chars: str | None):
    from bankml.server.fields import SAMPLER_CHARS, SAMPLER_NAMES
    if chars is not None:
        return tuple(SAMPLER_CHARS[c] for c in chars if c in SAMPLER_CHARS)
    return tuple(SAMPLER_NAMES[n.lower()] for n in names.split(";") if n.lower() in SAMPLER_NAMES)


def sampler_kwargs(temp, top_k, top_p, min_p, opts: dict) -> dict:
    """The interface's fields from the flags (opts: the s_* arguments)."""
    kw = {**LLAMA_DEFAULTS, "temp": max(c_float(temp), 0.0), "top_k": top_k, "top_p": c_float(top_p), "min_p": c_float(min_p)}
    for _, name, kind, _ in FLAGS:
        v = opts.get(f"s_{name}")
        if v is None or name in ("samplers", "samplers_seq"):
            continue
        kw[name] = c_float(v) if kind is FLOAT else v
    if opts.get("s_repeat_last_n") is not None and opts["s_repeat_last_n"] < 0:
        raise _bad("--repeat-last-n", f"invalid repeat-last-n = {opts['s_repeat_last_n']}")
    if opts.get("s_dry_penalty_last_n") is not None and opts["s_dry_penalty_last_n"] < 0:
        raise _bad("--dry-penalty-last-n", f"invalid dry-penalty-last-n = {opts['s_dry_penalty_last_n']}")
    rep = kw["repeat_penalty"]
    if not math.isfinite(rep) or rep <= 0 or not math.isfinite(c_float(1.0 / rep)):
        raise _bad("--repeat-penalty", "repeat-penalty must be finite and greater than 0")
    for name, flag in (("presence_penalty", "--presence-penalty"), ("frequency_penalty", "--frequency-penalty")):
        if not math.isfinite(kw[name]):
            raise _bad(flag, f"{flag[2:]} must be finite")
    if kw["dry_base"] < 1.0:                            # arg.cpp: a dry-base below 1 is ignored
        kw["dry_base"] = D["dry_base"]
    if opts.get("s_dry_sequence_breakers"):
        kw["dry_sequence_breakers"] = ()
        for b in opts["s_dry_sequence_breakers"]:
            kw["dry_sequence_breakers"] = () if b == "none" else kw["dry_sequence_breakers"] + (b,)
    if opts.get("s_logit_bias"):
        kw["logit_bias"] = _logit_bias(opts["s_logit_bias"])
    if opts.get("s_samplers") is not None or opts.get("s_samplers_seq") is not None:
        kw["samplers"] = _samplers(opts.get("s_samplers"), opts.get("s_samplers_seq"))
    return kw


def sampler_params(temp, top_k, top_p, min_p, opts: dict):
    """SamplerParams from the flags (ValueError: what common_sampler_init refuses, a sampler bankml
    does not implement)."""
    return SamplerParams(**sampler_kwargs(temp, top_k, top_p, min_p, opts))


# ---------------------------------------------------------------- constrained output

def grammar_options(fn):
    """llama-cli's --grammar, --grammar-file, -j/--json-schema and -jf/--json-schema-file."""
    fn = click.option("-jf", "--json-schema-file", "g_json_schema_file", default=None, metavar="FILE",
                      type=click.Path(dir_okay=False), help="--json-schema from a file.")(fn)
    fn = click.option("-j", "--json-schema", "g_json_schema", default=None, metavar="SCHEMA",
                      help="A JSON schema the reply must match (made a grammar as llama.cpp makes it).")(fn)
    fn = click.option("--grammar-file", "g_grammar_file", default=None, metavar="FILE",
                      type=click.Path(dir_okay=False), help="--grammar from a file.")(fn)
    fn = click.option("--grammar", "g_grammar", default=None, metavar="GBNF",
                      help="A GBNF grammar every generated token must fit (llama.cpp's grammars).")(fn)
    return fn


def grammar_text(opts: dict) -> str:
    """The GBNF the grammar flags in opts ask for ("" for none), as common/arg.cpp reads them: a
    JSON schema through json_schema_to_grammar. One flag at most; a bad schema fails here, one line."""
    from bankml.runtime.grammar.json_schema import SchemaError, to_grammar
    given = {k: v for k, v in opts.items() if k.startswith("g_") and v is not None}
    for k in given:
        opts.pop(k)
    if len(given) > 1:
        raise click.UsageError("give one of --grammar, --grammar-file, --json-schema, --json-schema-file")
    if not given:
        return ""
    (key, value), = given.items()
    flag = "--" + key[2:].replace("_", "-")
    if key.endswith("_file"):
        try:
            value = Path(value).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise click.BadParameter(f"cannot read {value}: {e}", param_hint=flag) from None
    if key.startswith("g_grammar"):
        return value
    try:
        return to_grammar(json.loads(value))
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=flag) from None
    except SchemaError as e:
        raise click.BadParameter(str(e).replace("\n", " "), param_hint=flag) from None
