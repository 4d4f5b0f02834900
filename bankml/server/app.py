"""`bankml serve`: an ASGI app (starlette) of the OpenAI and Ollama routes over one model's slots.

    app = make_app(model, n_slots=1, queue_size=16, http=HttpOptions(api_keys=("KEY",)))
    uvicorn.run(app, host="127.0.0.1", port=8080)

In front of the routes: the Host check, CORS, the body cap and the keys (guard.py).

The event loop only parses, queues and streams: prompts are tokenized on one prompt thread, and each
slot runs its generations in its own worker thread (the llvm backend releases the GIL in native
code and runs one micro-batch of the shared model at a time); a streamed token's text reaches
the loop through one hand-off thread (handoff.py) while the next decode runs. A client that goes
away, mid-stream or while waiting for a whole answer, cancels its generation between two
tokens, and its slot is released. A stream quiet for --sse-ping-interval seconds (a long prefill)
gets an SSE comment line, as llama-server sends, so that clients and proxies do not time out.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from bankml.errors import BankmlError
from bankml.runtime.embeddings import embed
from bankml.runtime.grammar.pieces import Pieces
from bankml.server import webui
from bankml.server.api import embeddings, native, ollama, openai, props, refused, structured, tools, utility
from bankml.server.engine import Job, run_job, timings_so_far
from bankml.server.steps import DecodeSteps
from bankml.server.fields import (BadRequest, Vocab, boolean, chat_logprobs, child_seed, job_fields, n_cmpl,
                                  nested_values, response_fields, slot_asked, sse_ping)
from bankml.server.guard import HttpOptions, guarded
from bankml.server.handoff import Handoff
from bankml.server.ids import completion_id
from bankml.server.jsonio import JSONResponse, ndjson, read_json, sse
from bankml.server.metrics import CONTENT_TYPE as METRICS_TYPE, Metrics
from bankml.tokenizer import tokenizer_for
from bankml.server.slots import Busy, SlotPool

class Server:
    def __init__(self, model, n_slots: int = 1, queue_size: int = 16, cache_ram_mib: int = 8192,
                 swa_full: bool = False, ping_s: float = 30.0, metrics: bool = False, pooling: str | None = None):
        self.model = model
        self.pooling = pooling                  # --embeddings: the pooling ("none", "mean", ...); None: off
        self._embedder = None                   # the embeddings' session, used on the prompt thread only
        self.metrics = Metrics() if metrics else None     # GET /metrics (--metrics, as llama-server's)
        self.name = model.path.name
        self.pool = SlotPool(model, n_slots, queue_size, cache_ram_mib, swa_full)
        self.workers = {s.id: ThreadPoolExecutor(1, thread_name_prefix=f"bankml-slot-{s.id}") for s in self.pool.slots}
        # the slots' decodes in shared steps (continuous batching, each slot's solo bits): server/steps.py
        self.steps = DecodeSteps(model) if n_slots > 1 else None
        if self.steps is not None and self.metrics is not None:
            self.steps.on_step = self.metrics.step
        self.ping_s = ping_s                    # SSE ping interval (<= 0: none)
        self.vocab = Vocab.of(model)            # what logit_bias and ignore_eos read
        tok = tokenizer_for(model)
        self.piece = lambda t: tok.piece(t, special=False)
        self.detokenize = lambda ids: tok.decode(ids, special=True)
        self._pieces = None                     # the vocabulary as grammars match it (runtime/grammar/pieces.py)
        self.started = time.time()
        self.n_tasks = 0                        # tasks so far: a task's id (GET /slots)
        self.handoff = Handoff()                # the workers' events to the loop (handoff.py)
        # prompts are rendered and tokenized on one thread: it is Python under the GIL, so more
        # threads would not go faster, and one bounds the memory of many large prompts at once
        self.prep = ThreadPoolExecutor(1, thread_name_prefix="bankml-prompt")
        weakref.finalize(self, self.handoff.close)

    def constrain(self, constraint: structured.Constraint | None) -> dict:
        """A request's grammar fields (Job.grammar, Job.grammar_text): parsed and prefilled, or none."""
        if constraint is None:
            return {"grammar": None, "grammar_text": ""}
        tok = tokenizer_for(self.model)
        if self._pieces is None:
            self._pieces = Pieces([tok.piece(t, special=True) for t in range(tok.n_vocab)], tok.eog)

        def tokenize(text):
            return self.model.tokenize(text, add_special=False, parse_special=True)
        return {"grammar": constraint.start(self._pieces, tokenize), "grammar_text": constraint.text}

    async def prepare(self, fn, *args):
        """fn(*args) on the prompt thread."""
        return await asyncio.get_running_loop().run_in_executor(self.prep, fn, *args)

    def embed(self, prompts: list[list[int]], embd_norm: int | None) -> list:
        """Each prompt's embedding (runtime/embeddings.py), on the prompt thread: one session of
        its own, emptied for each prompt as llama-server computes an embedding's prompt whole."""
        if self._embedder is None:
            self._embedder = self.model.session()
        try:
            return [embed(self.model, p, self.pooling, 2 if embd_norm is None else embd_norm, self._embedder)
                    for p in prompts]
        except BankmlError as e:
            raise BadRequest(str(e), 500, "server_error") from None

    async def generate(self, prompt: list[int], fields: dict, stream: bool = True, ping_s: float | None = None,
                       id_slot: int = -1):
        """A slot for the prompt (Busy when the queue is full), then its events as they come:
        ("text", str, Prob | None, token) per token when streaming, then ("done", Result, None, None)
        or ("error", exception, None, None). ping_s: the request's sse_ping_interval (None: the server's)."""
        if len(prompt) >= self.model.n_ctx:
            raise BadRequest(f"request ({len(prompt)} tokens) exceeds the available context size "
                             f"({self.model.n_ctx} tokens), try increasing it", 400, "exceed_context_size_error")
        job = Job(prompt=prompt, **fields)
        slot = await self.pool.acquire(prompt, id_slot)
        self.n_tasks += 1
        slot.last = (self.n_tasks, fields, stream)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def put(ev):
            self.handoff.put(loop, q.put_nowait, ev)

        def work():
            on_text = (lambda s, t, p: put(("text", s, p, t))) if stream else (lambda s, t, p: None)
            try:
                r = run_job(self.model, slot, job, on_text, cancel.is_set, self.steps)
                if self.metrics is not None:
                    self.metrics.record(r, shared_steps=self.steps is not None and self.steps.enabled)
                put(("done", r, None, None))
            except Exception as e:          # a bankml bug: reported to the client and logged
                print(f"bankml serve: generation failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                put(("error", e, None, None))
            finally:
                self.handoff.put(loop, self.pool.release, slot)

        loop.run_in_executor(self.workers[slot.id], work)
        ping_s = self.ping_s if ping_s is None else ping_s
        return _Events(q, cancel, ping_s if stream else 0.0, slot.id)

    async def completions(self, prompt: list[int], fields: dict, n: int = 1, stream: bool = True,
                          ping_s: float | None = None, id_slot: int = -1) -> Completions:
        """n generations of the prompt (n_cmpl), the k-th with seed + k (only the first on the slot
        asked for, as llama-server's child tasks); Busy when the queue is full (the ones already
        started are cancelled)."""
        started: list[_Events] = []
        try:
            for k in range(n):
                started.append(await self.generate(prompt, {**fields, "seed": child_seed(fields["seed"], k)},
                                                   stream, ping_s, id_slot if k == 0 else -1))
        except BaseException:
            for e in started:
                e.cancel.set()
            raise
        return Completions(started)

    def close(self) -> None:
        self.prep.shutdown(wait=True, cancel_futures=True)
        for w in self.workers.values():
            w.shutdown(wait=True, cancel_futures=True)


class _Events:
    """One generation's events; ("ping", ...) when a stream was quiet for ping_s seconds."""

    def __init__(self, q: asyncio.Queue, cancel: threading.Event, ping_s: float = 0.0, slot_id: int = 0):
        self.q, self.cancel, self.ping_s, self.slot_id = q, cancel, ping_s, slot_id

    async def __aiter__(self):
        try:
            while True:
                if self.ping_s > 0:
                    try:
                        ev = await asyncio.wait_for(self.q.get(), self.ping_s)
                    except asyncio.TimeoutError:
                        yield PING
                        continue
                else:
                    ev = await self.q.get()
                yield ev
                if ev[0] != "text":
                    return
        finally:
            self.cancel.set()               # the client left (or the stream ended): stop generating


class Completions:
    """The generations of one request: one, or n_cmpl of them (the k-th samples with seed + k), each
    on its own slot. Iterated: (k, event) as the events come."""

    def __init__(self, events: list[_Events]):
        self.events = events

    def cancel(self) -> None:
        for e in self.events:
            e.cancel.set()

    async def __aiter__(self):
        try:
            if len(self.events) == 1:       # the common case: no merging, no extra hop per token
                async for ev in self.events[0]:
                    yield 0, ev
            else:
                async for k, ev in self._merged():
                    yield k, ev
        finally:
            self.cancel()                   # the client left (or all ended): stop generating

    async def _merged(self):
        q: asyncio.Queue = asyncio.Queue()

        async def pump(k, events):
            try:
                async for ev in events:
                    q.put_nowait((k, ev))
            finally:
                q.put_nowait((k, None))
        pumps = [asyncio.ensure_future(pump(k, e)) for k, e in enumerate(self.events)]
        try:
            left = len(pumps)
            while left:
                k, ev = await q.get()
                if ev is None:
                    left -= 1
                    continue
                yield k, ev
                if ev[0] == "error":
                    return
        finally:
            for p in pumps:
                p.cancel()

    async def results(self, request: Request) -> list:
        """Each completion's Result, by index; a client that disconnects meanwhile cancels them
        (the workers stop at the next token) instead of leaving slots generating for no one."""
        async def watch():
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.cancel()
        watcher = asyncio.ensure_future(watch())
        out = [None] * len(self.events)
        try:
            async for k, (kind, value, _, _) in self:
                if kind == "done":
                    out[k] = value
                elif kind == "error":
                    raise value
        finally:
            watcher.cancel()
        if any(r is None for r in out):
            raise RuntimeError("a generation ended without a result")
        return out


PING = ("ping", None, None, None)
SSE_PING = b":\n\n"                         # llama-server's keep-alive: an SSE comment line
FAILED = "generation failed; the server's log says why"    # no internal text goes to a client
SSE_FAILED = sse({"error": openai.error_body(FAILED, 500, "server_error")["error"]})


# ---------------------------------------------------------------- helpers

def oai_error(message: str, status: int = 400, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(openai.error_body(message, status, kind), status_code=status)


BUSY = "the server is busy: every slot is working and the queue is full; retry later"


# ---------------------------------------------------------------- OpenAI routes

async def health(request: Request):
    return JSONResponse({"status": "ok"})


async def models(request: Request):
    srv: Server = request.app.state.server
    return JSONResponse(openai.models_list(srv.model, srv.name))


async def slots(request: Request):
    """llama-server's GET /slots (server/api/props.py); ?fail_on_no_slot=1: 503 when none is free."""
    srv: Server = request.app.state.server
    if request.query_params.get("fail_on_no_slot") and srv.pool.n_busy() == len(srv.pool.slots):
        return oai_error("no slot available", 503, "unavailable_error")
    return JSONResponse([props.slot(s, srv.model.n_ctx) for s in srv.pool.slots])


async def get_props(request: Request):
    """llama-server's /props (server/api/props.py); POST (changing them) is its 501 without --props."""
    srv: Server = request.app.state.server
    if request.method == "POST":
        return oai_error("This server does not support changing global properties. Start it with `--props`", 501,
                         "not_supported_error")
    return JSONResponse(props.props(srv.model, srv.name, len(srv.pool.slots), job_fields({}, srv.vocab),
                                    srv.metrics is not None))


async def get_metrics(request: Request):
    """llama-server's /metrics: Prometheus text, with --metrics only (501 otherwise, as llama-server)."""
    srv: Server = request.app.state.server
    if srv.metrics is None:
        return oai_error("This server does not support metrics endpoint. Start it with `--metrics`", 501,
                         "not_supported_error")
    body = srv.metrics.exposition(srv.pool.n_busy(), len(srv.pool.waiting))
    return Response(body, media_type=METRICS_TYPE,
                    headers={"Process-Start-Time-Unix": str(int(srv.metrics.started * 1e6))})


async def chat_completions(request: Request):
    return await _openai(request, chat=True)


async def completions(request: Request):
    return await _openai(request, chat=False)


def refusal(e: BadRequest | Busy):
    """An OpenAI-shaped error for a refused request (llama-server's message and status) or a full queue."""
    if isinstance(e, Busy):
        return oai_error(BUSY, 503, "unavailable_error")
    return oai_error(str(e), e.status, e.kind)


async def _openai(request: Request, chat: bool):
    srv: Server = request.app.state.server
    try:
        body = await read_json(request)
        refused.request("/v1/chat/completions" if chat else "/v1/completions", body, srv.model)
        if chat:
            body = chat_logprobs(body)
        fields = job_fields(body, srv.vocab)
        n = n_cmpl(body, len(srv.pool.slots))
        stream = boolean(body, "stream", False)
        opts = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
        include_usage = boolean(opts, "include_usage", False)
        per_token = boolean(body, "timings_per_token", False)
        if chat:
            messages, variables, tool_req = await srv.prepare(openai.chat_inputs, srv.model, body)
            cont = openai.continuation(body)
            prompt = await srv.prepare(openai.chat_prompt, srv.model, messages, openai.generation_prompt(body),
                                       cont, variables)
            fields["user_starts"] = openai.user_starts(srv.model, prompt)
            continued = cont is not None or bool(messages) and messages[-1]["role"] == "assistant"
            constraint = await srv.prepare(structured.chat, body, srv.model, messages, variables, continued,
                                           tool_req)
        else:
            prompt = await srv.prepare(openai.completion_prompt, srv.model, body)
            constraint = structured.native(body)
        calls = constraint.calls if constraint is not None else None    # the reply's tool calls are parsed
        fields.update(await srv.prepare(srv.constrain, constraint))
        parsed = chat and calls is None and constraint is not None and bool(constraint.prefill)   # the chat parser's content
        group = await srv.completions(prompt, fields, n, stream, sse_ping(body), slot_asked(body))
    except (BadRequest, Busy) as e:
        return refusal(e)
    cid = completion_id("chatcmpl-" if chat else "cmpl-")
    post = fields["post_sampling_probs"]
    if not stream:
        try:
            rs = await group.results(request)
        except Exception:
            return oai_error(FAILED, 500, "server_error")
        if parsed:
            rs = [dataclasses.replace(r, text=structured.answer(r.text)) for r in rs]
        replies = [tools.reply(r.text, *calls) if calls is not None else (r.text, None) for r in rs]
        rs = [dataclasses.replace(r, text=text) for r, (text, _) in zip(rs, replies)]

        def make(r, k):
            if chat:
                return openai.chat_response(r, cid, srv.name, post, srv.piece, replies[k][1])
            return openai.text_response(r, cid, srv.name, post, srv.piece)
        res = make(rs[0], 0)
        for k, r in enumerate(rs[1:], 1):           # llama-server: the first's answer, every choice
            res["choices"] += openai.indexed(make(r, k), k)["choices"]
        if body.get("verbose") is True and body.get("return_tokens") is True:
            res["__verbose"] = {"content": rs[0].text, "tokens": rs[0].tokens, "stop_type": rs[0].stop_type}
        return JSONResponse(res)

    async def body_iter():
        first, count = [True] * n, [0] * n
        content = [structured.ContentStream() for _ in range(n)] if parsed else None
        called = [tools.ToolStream(*calls) for _ in range(n)] if calls is not None else None
        async for k, (kind, value, prob, _) in group:
            if kind == "ping":
                yield SSE_PING
            elif kind == "text":
                count[k] += 1
                if content is not None:
                    value = content[k].push(value)
                elif called is not None:
                    value = called[k].push(value)
                if chat:
                    chunks = openai.chat_token_chunks(cid, srv.name, first[k], value, prob, post, srv.piece)
                else:
                    chunks = [openai.text_chunk(cid, srv.name, value, prob=prob, post=post, piece=srv.piece)]
                if per_token and chunks:        # timings_per_token: on the token's last chunk
                    chunks[-1]["timings"] = timings_so_far(srv.pool.slots[group.events[k].slot_id], count[k])
                for c in chunks:
                    yield sse(openai.indexed(c, k))
                first[k] = False
            elif kind == "done":
                if called is not None and called[k].calls and value.stop_type in ("eos", "word"):
                    value = dataclasses.replace(value, finish="tool_calls")
                if chat:
                    for c in openai.chat_final_chunks(value, cid, srv.name, include_usage):
                        yield sse(openai.indexed(c, k))
                else:
                    last = openai.text_chunk(cid, srv.name, "", value.finish)
                    last["timings"] = value.timings()
                    if include_usage:
                        last["usage"] = openai.usage(value)
                    yield sse(openai.indexed(last, k))
            else:
                yield SSE_FAILED
                return
        yield b"data: [DONE]\n\n"
    return StreamingResponse(body_iter(), media_type="text/event-stream")


async def completion(request: Request):
    """llama-server's own /completion (server/api/native.py)."""
    srv: Server = request.app.state.server
    try:
        body = await read_json(request)
        refused.request("/completion", body, srv.model)
        fields = job_fields(body, srv.vocab)
        stream = boolean(body, "stream", False)
        return_tokens = boolean(body, "return_tokens", False)
        per_token = boolean(body, "timings_per_token", False)
        n = n_cmpl(body, len(srv.pool.slots))
        prompt = await srv.prepare(openai.completion_prompt, srv.model, body)
        fields.update(await srv.prepare(srv.constrain, structured.native(body)))
        group = await srv.completions(prompt, fields, n, stream, sse_ping(body), slot_asked(body))
    except (BadRequest, Busy) as e:
        return refusal(e)
    post = fields["post_sampling_probs"]
    prompt_text = srv.detokenize(prompt)
    job = [{**fields, "seed": child_seed(fields["seed"], k)} for k in range(n)]
    keep = response_fields(body)
    if not stream:
        try:
            rs = await group.results(request)
        except Exception:
            return oai_error(FAILED, 500, "server_error")
        out = [native.final(r, job[k], srv.name, prompt_text, False, srv.piece, return_tokens, k,
                            group.events[k].slot_id) for k, r in enumerate(rs)]
        out = [nested_values(keep, o) for o in out] if keep else out
        return JSONResponse(out[0] if n == 1 else out)      # several: an array, as llama-server's

    async def body_iter():
        count = [0] * n
        async for k, (kind, value, prob, tok) in group:
            if kind == "ping":
                yield SSE_PING
            elif kind == "text":
                count[k] += 1
                if prob is not None or not fields["n_probs"]:
                    slot_id = group.events[k].slot_id
                    out = native.partial(count[k], len(prompt), value, tok, prob, post, srv.piece, k, slot_id)
                    if per_token:
                        out["timings"] = timings_so_far(srv.pool.slots[slot_id], count[k])
                    yield sse(out)
            elif kind == "done":
                last = native.final(value, job[k], srv.name, prompt_text, True, srv.piece, index=k,
                                    id_slot=group.events[k].slot_id)
                yield sse(nested_values(keep, last) if keep else last)
            else:
                yield SSE_FAILED
                return
    return StreamingResponse(body_iter(), media_type="text/event-stream")


def _utility(fn):
    """A route of utility.py: fn(model, body) on the prompt thread (it tokenizes or renders)."""
    async def route(request: Request):
        srv: Server = request.app.state.server
        try:
            body = await read_json(request)
            return JSONResponse(await srv.prepare(fn, srv.model, body))
        except BadRequest as e:
            return refusal(e)
    return route


async def oai_embeddings(request: Request):
    return await _embeddings(request, oai=True)


async def native_embeddings(request: Request):
    return await _embeddings(request, oai=False)


def _embedding_mode(srv: Server, oai: bool) -> None:
    if srv.pooling is None:
        raise BadRequest(embeddings.NOT_STARTED, 501, "not_supported_error")
    if oai and srv.pooling == "none":
        raise BadRequest("Pooling type 'none' is not OAI compatible. Please use a different pooling type")


async def _embeddings(request: Request, oai: bool):
    """llama-server --embeddings: /v1/embeddings (OpenAI's shape), /embedding and /embeddings (its own)."""
    srv: Server = request.app.state.server
    try:
        body = await read_json(request)
        _embedding_mode(srv, oai)
        refused.request("/v1/embeddings", body, srv.model)
        prompts, use_base64, norm = await srv.prepare(embeddings.request, srv.model, body)
        vectors = await srv.prepare(srv.embed, prompts, norm)
    except BadRequest as e:
        return refusal(e)
    if not oai or "content" in body and "input" not in body:    # "content" is not OpenAI's: the native shape
        return JSONResponse(embeddings.native_response(vectors))
    return JSONResponse(embeddings.oai_response(body, srv.name, vectors, sum(map(len, prompts)), use_base64))


# ---------------------------------------------------------------- Ollama routes

async def api_chat(request: Request):
    return await _ollama(request, "chat")


async def api_generate(request: Request):
    return await _ollama(request, "generate")


async def _ollama(request: Request, kind: str):
    srv: Server = request.app.state.server
    t0 = time.perf_counter_ns()
    try:
        body = await read_json(request)
        name = body["model"] if isinstance(body.get("model"), str) and body["model"] else srv.name
        loaded = ollama.load_request(body, kind)   # `ollama run` first: no prompt, only "load the model"
        if loaded is not None:
            return JSONResponse({"model": name, **loaded})
        refused.request(f"/api/{kind}", body, srv.model)
        fields = {**ollama.options_fields(body, srv.vocab, srv.model.n_ctx), **ollama.logprob_fields(body)}
        with_top = bool(fields.get("n_probs")) and bool(body.get("top_logprobs"))
        stream = ollama.streaming(body)
        wanted = structured.ollama(body, kind)      # format, as the llama-server fields Ollama sends
        if kind == "chat":
            messages, variables, tool_req = await srv.prepare(ollama.chat_inputs, srv.model, body)
            prompt = await srv.prepare(openai.chat_prompt, srv.model, messages, True, None, variables)
            fields["user_starts"] = openai.user_starts(srv.model, prompt)
            continued = bool(messages) and messages[-1]["role"] == "assistant"
            constraint = await srv.prepare(structured.chat, wanted, srv.model, messages, variables, continued,
                                           tool_req)
        else:
            prompt = await srv.prepare(ollama.generate_ids, srv.model, body)
            constraint = structured.native(wanted)
        fields.update(await srv.prepare(srv.constrain, constraint))
        calls = constraint.calls if constraint is not None else None
        parsed = kind == "chat" and calls is None and constraint is not None and bool(constraint.prefill)
        events = await srv.generate(prompt, fields, stream)
    except BadRequest as e:
        return JSONResponse(ollama.error_body(str(e)), status_code=e.status)
    except Busy:
        return JSONResponse(ollama.error_body(BUSY), status_code=503)
    if not stream:
        try:
            r, = await Completions([events]).results(request)
        except Exception:
            return JSONResponse(ollama.error_body(FAILED), status_code=500)
        text = structured.answer(r.text) if parsed else r.text
        called = None
        if calls is not None:               # Ollama gathers llama-server's streamed deltas
            called = tools.ToolStream(*calls)
            text = "".join(d.get("content", "") for d in called.push(r.text))
        out = ollama.final(name, kind, r, text, time.perf_counter_ns() - t0, prompt)
        if called is not None and called.calls:
            try:
                out["message"]["tool_calls"] = ollama.tool_calls(called.calls, called.ids)
            except BadRequest as e:
                return JSONResponse(ollama.error_body(str(e)), status_code=e.status)
        if fields.get("n_probs"):           # every streamed chunk's, as Ollama gathers them
            out["logprobs"] = ollama.logprobs([p for p in r.probs if p.sent], srv.piece, with_top)
        return JSONResponse(out)

    async def body_iter():
        content = structured.ContentStream() if parsed else None
        called = tools.ToolStream(*calls) if calls is not None else None
        async for ev, value, prob, _ in events:
            if ev == "text":
                if content is not None:
                    value = content.push(value)
                elif called is not None:
                    value = "".join(d.get("content", "") for d in called.push(value))
                if value:
                    c = ollama.chunk(name, kind, value)
                    if prob is not None:
                        c["logprobs"] = ollama.logprobs([prob], srv.piece, with_top)
                    yield ndjson(c)
            elif ev == "done":
                last = ollama.final(name, kind, value, "", time.perf_counter_ns() - t0, prompt)
                if called is not None and called.calls:
                    try:
                        last["message"]["tool_calls"] = ollama.tool_calls(called.calls, called.ids)
                    except BadRequest as e:
                        last = ollama.error_body(str(e))
                yield ndjson(last)
            else:
                yield ndjson(ollama.error_body(FAILED))
    return StreamingResponse(body_iter(), media_type="application/x-ndjson")


async def api_embed(request: Request):
    """Ollama's /api/embed over llama-server's vectors (the server's pooling, normalised)."""
    srv: Server = request.app.state.server
    t0 = time.perf_counter_ns()
    try:
        body = await read_json(request)
        _embedding_mode(srv, oai=True)
        refused.request("/api/embed", body, srv.model)
        prompts = await srv.prepare(embeddings.ollama_inputs, srv.model, body)
        vectors = await srv.prepare(srv.embed, prompts, None)
    except BadRequest as e:
        return JSONResponse(ollama.error_body(str(e)), status_code=e.status)
    name = body["model"] if isinstance(body.get("model"), str) and body["model"] else srv.name
    return JSONResponse(embeddings.ollama_response(name, vectors, sum(map(len, prompts)), time.perf_counter_ns() - t0))


async def api_tags(request: Request):
    srv: Server = request.app.state.server
    return JSONResponse(ollama.tags(srv.model, srv.name))


async def api_ps(request: Request):
    srv: Server = request.app.state.server
    return JSONResponse(ollama.ps(srv.model, srv.name, len(srv.pool.slots)))


async def api_show(request: Request):
    srv: Server = request.app.state.server
    try:
        await read_json(request)
    except BadRequest as e:
        return JSONResponse(ollama.error_body(str(e)), status_code=400)
    return JSONResponse(ollama.show(srv.model, srv.name))


async def api_version(request: Request):
    return JSONResponse({"version": ollama.VERSION})


# ---------------------------------------------------------------- the app

async def not_found(request: Request, exc):
    return JSONResponse({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}},
                        status_code=404)


async def server_error(request: Request, exc):
    print(f"bankml serve: {request.url.path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return JSONResponse(openai.error_body("internal server error; the server's log says why", 500, "server_error"),
                        status_code=500)


def make_app(model, n_slots: int = 1, queue_size: int = 16, api_key: str | None = None, cache_ram_mib: int = 8192,
             swa_full: bool = False, http: HttpOptions | None = None, metrics: bool = False,
             pooling: str | None = None):
    """The guarded app (guard.py); `api_key` adds one key to http.api_keys; `metrics` serves /metrics;
    `pooling` ("mean", "cls", "last", "none") serves the embeddings routes with it (None: their 501)."""
    http = http or HttpOptions()
    if api_key:
        http = dataclasses.replace(http, api_keys=(*http.api_keys, api_key))
    server = Server(model, n_slots, queue_size, cache_ram_mib, swa_full, http.sse_ping_s, metrics, pooling)
    routes = [
        Route("/", webui.root, methods=["GET", "HEAD"]),
        Route("/health", health), Route("/v1/health", health),
        Route("/v1/models", models), Route("/models", models), Route("/slots", slots), Route("/metrics", get_metrics),
        Route("/props", get_props, methods=["GET", "POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/completions", completions, methods=["POST"]),
        Route("/completion", completion, methods=["POST"]),
        Route("/tokenize", _utility(utility.tokenize), methods=["POST"]),
        Route("/detokenize", _utility(utility.detokenize), methods=["POST"]),
        Route("/apply-template", _utility(utility.apply_template), methods=["POST"]),
        Route("/v1/embeddings", oai_embeddings, methods=["POST"]),
        Route("/embedding", native_embeddings, methods=["POST"]), Route("/embeddings", native_embeddings, methods=["POST"]),
        Route("/api/chat", api_chat, methods=["POST"]), Route("/api/generate", api_generate, methods=["POST"]),
        Route("/api/embed", api_embed, methods=["POST"]),
        Route("/api/tags", api_tags), Route("/api/ps", api_ps), Route("/api/show", api_show, methods=["POST"]),
        Route("/api/version", api_version),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        server.close()

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found, 500: server_error},
                    lifespan=lifespan)
    app.state.server = server
    return guarded(app, http)
