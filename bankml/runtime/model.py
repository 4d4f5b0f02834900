"""bankml.load(): a model file read and planned, its generic graphs, a backend, sessions.

A model builds one generic graph per variant (bankml.passes.variants: decode, decode-split,
small/large micro-batches with all or the last rows' logits); the backend compiles each the
first time it is needed (saying so on stderr) and runs it for any size in its range, so no
prompt length and no context length compiles again. `Model.close()` (or `with`) releases the
compiled code, the thread pool, the device and the file. `Model(path, options)` takes what
load() takes as one checked ModelOptions (runtime/options.py).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bankml.arch.blocks import Batch, Builder
from bankml.arch import registry
from bankml.backends import open_backend
from bankml.errors import BankmlError
from bankml.gguf import read_gguf
from bankml.arch.plan import plan as make_plan
from bankml.ir.graph import Graph
from bankml.passes.pipeline import run_passes
from bankml.passes.variants import Variant, choose_variant, seqs_variant, variants
from bankml.profiles.portable import coded, quant
from bankml.quants import F32
from bankml.quants.kv_cache import KvCacheTypes
from bankml.runtime.options import ModelOptions
from bankml.backends.llvm import jit_cache

if TYPE_CHECKING:
    from bankml.runtime.batch import SessionBatch
    from bankml.runtime.session import Session


class Model:
    def __init__(self, path, options: ModelOptions | None = None):
        o = self.options = options or ModelOptions()
        self.profile = o.profile        # float orders: "ggml" (llama.cpp's bits) | "portable" (docs/PORTABLE.md)
        self.path = Path(path)
        self.gguf = read_gguf(self.path)
        self.chat_template: str | None = None     # a template file's text over the header's (--chat-template-file)
        spec = registry.lookup(o.arch) if o.arch else None
        declared = spec is not None and spec.tensors is not None   # a full declaration plans the file itself
        self.plan = make_plan(self.gguf, o.arch if declared else None)
        self.hparams = self.plan.hparams
        self.backend, self.threads = o.backend, o.threads
        self.llama_threads = o.llama_threads or o.threads
        self.n_ubatch, self.n_ctx = o.n_ubatch, o.n_ctx
        # the K/V cache's types (-ctk/-ctv; cache_type sets both), refused here if not reproduced
        self.kv = KvCacheTypes.of(o.cache_type_k or o.cache_type, o.cache_type_v or o.cache_type, self.hparams.head_dim)
        self.cache_type_k, self.cache_type_v = self.kv.k, self.kv.v
        self.cache_type = self.kv.k if self.kv.k == self.kv.v else f"{self.kv.k},{self.kv.v}"
        self.arch = o.arch or self.plan.arch        # a registered builder may stand in for the file's
        self.architecture = registry.get(self.arch)
        if o.profile == "portable" and (self.kv.quantized or not self.architecture.portable):
            *some, last = registry.portable()
            raise BankmlError(f"profile 'portable' runs {', '.join(some)} and {last} graphs with its own int8 "
                              f"cache (cache_type f16); not {self.arch} with a {self.cache_type} cache")
        self._weights: dict[str, np.ndarray] = {}
        self.gpu = o.gpu
        self.kv_size = -(-o.n_ctx // 256) * 256        # llama-context.cpp: n_ctx padded to 256
        # llama_kv_cache_iswa: the sliding-window layers' cache, full size (swa_full, as
        # llama_context_default_params) or PAD256(min(kv_size, n_swa + n_ubatch)) (llama-server)
        self.swa_full = o.swa_full
        self.kv_size_swa = None
        if self.hparams.n_swa:
            small = -(-min(self.kv_size, self.hparams.n_swa + o.n_ubatch) // 256) * 256
            self.kv_size_swa = self.kv_size if o.swa_full else small
        self.shapes = {name: t.shape for name, t in self.gguf.tensors.items()}
        self.variants = variants(o.n_ubatch, self.kv_size, self.kv_size_swa)
        self.seqs_variant = seqs_variant(self.kv_size, self.kv_size_swa)    # Model.batch's decode step
        self.compile_seconds = 0.0      # time this model spent compiling native code so far (llvm backend)
        self._graphs: dict[str, Graph] = {}         # variant name -> generic graph after the passes
        self._ready: set[str] = set()               # variants the backend has prepared
        self._ready_for: dict[tuple, tuple[Graph, dict]] = {}   # run_ubatch's sizes -> (prepared graph, Dim values)
        self._prepare_lock = threading.RLock()      # graphs built and prepared once
        from bankml.backends.spirv.device import for_setting
        self.device = for_setting(o.gpu)            # a ModelGpu (decode's Q1_0 matvecs), or None
        if o.act_scaling == "PerBlock":       # a matrix without a block (F16) is refused here, naming it
            try:
                self.generic_graph(self.variants[0])
            except BankmlError as e:
                raise BankmlError(f"{self.path.name}: {e}") from None
        if o.profile == "portable":
            self._refuse_unreadable()
        self.runner = open_backend(o.backend, self.weight, o.threads, self.device)

    # ---- graphs ----
    def graph(self, n_tokens: int, n_kv: int, n_outputs: int) -> Graph:
        """The concrete IR of one micro-batch after every pass."""
        return run_passes(self.build_graph(n_tokens, n_kv, n_outputs))

    def build_graph(self, n_tokens, n_kv, n_outputs, n_kv_swa=None, want: str = "logits", seqs: bool = False) -> Graph:
        """The IR of one micro-batch as the architecture file builds it, before passes; sizes
        may be numbers or Dims (a generic graph). `want`: the output kept, "logits" or "embd" (the
        final-norm rows, llama.cpp's t_embd; the output head is then dead code). `seqs`: each
        token its own sequence's decode (a batch of sessions, runtime/batch.py)."""
        if n_kv_swa is None and self.kv_size_swa:
            n_kv_swa = self.n_kv_swa_for(n_kv)
        b = Builder(self.plan, Batch(n_tokens, n_kv, n_outputs, self.kv_size, n_kv_swa, self.kv_size_swa, seqs),
                    self.shapes, self.kv, self.architecture)
        self.architecture.build(b)
        g = b.g
        g.meta["llama_threads"] = self.llama_threads
        if self.profile != "ggml":
            g.meta["profile"] = self.profile
        if self.options.act_scaling != "Sub32":
            g.meta["act_scaling"] = self.options.act_scaling
        if self.device is not None:         # passes/place_on_device.py puts decode's Q1_0 matvecs there
            g.meta["device"] = "gpu"
        if want not in g.outputs:
            raise BankmlError(f"the {self.arch} graph has no {want!r} output")
        # no rows wanted: only the cache writes stay alive
        g.outputs = {want: g.outputs[want]} if n_outputs != 0 else {}
        return g

    def generic_graph(self, v: Variant, want: str = "logits") -> Graph:
        """The generic graph of a variant after every pass (built once per model and output)."""
        key = _key(v, want)
        with self._prepare_lock:                   # sessions of several threads share the model
            if key not in self._graphs:
                self._graphs[key] = run_passes(self.build_graph(v.n_tokens, v.n_kv, v.n_outputs, v.n_kv_swa, want,
                                                                v.seqs))
            return self._graphs[key]

    def prepare(self, v: Variant, want: str = "logits") -> float:
        """Make a variant ready to run (the llvm backend compiles it); the seconds that took."""
        with self._prepare_lock:                   # sessions of several threads share the model
            return self._prepare(v, want)

    def _prepare(self, v: Variant, want: str = "logits") -> float:
        key = _key(v, want)
        if key in self._ready:
            return 0.0
        t0, misses = time.perf_counter(), jit_cache.counts["miss"]
        self.runner.prepare(self.generic_graph(v, want))
        seconds = time.perf_counter() - t0
        if self.backend == "llvm":
            self.compile_seconds += seconds
            if jit_cache.counts["miss"] > misses or not jit_cache.enabled():
                why = "first use; cached afterwards" if jit_cache.enabled() else "BANKML_JIT_CACHE is off"
                print(f"bankml: compiled the {key} graph of {self.path.name} in {seconds:.1f} s ({why})",
                      file=sys.stderr, flush=True)
        self._ready.add(key)
        return seconds

    def compile(self, embeddings: bool = False, batch: bool = False) -> float:
        """Prepare every variant a session can need (with `embeddings`, Session.embeddings' too;
        with `batch`, Model.batch's decode step where the model has one); afterwards nothing
        compiles again."""
        wants = ("logits", "embd") if embeddings else ("logits",)
        seconds = sum(self.prepare(v, want) for want in wants for v in self.variants)
        if batch and self.batch_refusal() is None:
            seconds += self.prepare(self.seqs_variant)
        return seconds

    def warm_up(self) -> None:
        """One single-token decode on a throwaway session, as llama.cpp's common_init_from_params
        warms a model up before serving: the weights' pages are mapped and the decode graph's
        buffers touched, so the first request does not pay for it. Changes no state."""
        s = self.session()
        s.decode(self.hparams.n_vocab - 1)

    def cache_bytes(self) -> int:
        """Bytes of one session's caches: kv_size cells of each attention layer's K and V rows (and
        a hybrid model's recurrent states)."""
        from bankml.runtime.session import cache_layouts
        return sum(int(np.prod(shape)) * dtype.itemsize
                   for shape, dtype in cache_layouts(self.generic_graph(self.variants[0])).values())

    def n_kv(self, used: int) -> int:
        """Cells the attention reads when `used` cells are filled (llama_kv_cache::get_n_kv: a
        multiple of 256)."""
        return min(self.kv_size, max(256, -(-used // 256) * 256))

    def n_kv_swa_for(self, n_kv: int) -> int:
        """The sliding-window cells read beside n_kv base cells while the sequence only grows
        (the ring's n_kv is min(its size, the base's)); a session computes its own."""
        return min(self.kv_size_swa, n_kv)

    def micro_batches(self, n_tokens: int, outputs: str) -> list[tuple[int, int, list[int]]]:
        """How llama_decode cuts a batch of n_tokens: (start, stop, output rows within it) for
        each micro-batch of n_ubatch tokens; outputs "all" or "last" (the batch's last row)."""
        out = []
        for start in range(0, n_tokens, self.n_ubatch):
            stop = min(start + self.n_ubatch, n_tokens)
            rows = list(range(stop - start)) if outputs == "all" else [stop - start - 1] if stop == n_tokens else []
            out.append((start, stop, rows))
        return out

    def prepare_for(self, n_past: int, n_prompt: int, n_predict: int) -> float:
        """Prepare what a prompt of n_prompt tokens after n_past cells (the last row's logits) and
        n_predict decodes after it run, so that no compile interrupts a stream of tokens."""
        need = [(stop - start, self.n_kv(n_past + stop), len(rows))
                for start, stop, rows in self.micro_batches(n_prompt, "last")]
        first, last = n_past + n_prompt + 1, min(n_past + n_prompt + n_predict, self.kv_size)
        need += [(1, self.n_kv(used), 1) for used in {first, last} if n_predict > 0 and used <= self.kv_size]
        swa = (lambda n_kv: self.n_kv_swa_for(n_kv)) if self.kv_size_swa else (lambda n_kv: None)  # noqa: E731
        return sum(self.prepare(choose_variant(self.variants, *sizes, swa(sizes[1]))[0]) for sizes in need)

    def run_ubatch(self, n_tokens: int, n_kv: int, n_outputs: int, inputs: dict, caches: dict, trace=None,
                   n_kv_swa: int | None = None, want: str = "logits") -> dict:
        """One micro-batch through the variant that takes these sizes, its `want` output."""
        if self.runner is None:
            raise BankmlError(f"{self.path.name}: the model is closed")
        sizes = (n_tokens, n_kv, n_outputs, n_kv_swa, want)
        ready = self._ready_for.get(sizes)      # a decode meets the same sizes 256 steps in a row
        if ready is None:
            v, values = choose_variant(self.variants, *sizes[:4])
            self.prepare(v, want)
            ready = self._ready_for[sizes] = (self.generic_graph(v, want), values)
        return self.runner.run(*ready, inputs, caches, trace)

    def run_seqs(self, n_seqs: int, n_kv: int, inputs: dict, caches: dict, n_kv_swa: int | None = None) -> dict:
        """One decode token of each of n_seqs sequences through the decode-seqs graph (runtime/batch.py):
        caches maps each (layer, kind) to the list of the sequences' caches, in row order."""
        if self.runner is None:
            raise BankmlError(f"{self.path.name}: the model is closed")
        return self.runner.run(*self.seqs_graph(n_seqs, n_kv, n_kv_swa), inputs, caches)

    def seqs_graph(self, n_seqs: int, n_kv: int, n_kv_swa: int | None = None):
        """(graph, values): the decode-seqs graph, prepared, and its sizes for n_seqs sequences."""
        self.prepare(self.seqs_variant)
        values = {"T": n_seqs, "KV": n_kv, "O": n_seqs}
        if n_kv_swa is not None:
            values["KVS"] = n_kv_swa
        return self.generic_graph(self.seqs_variant), values

    def batch_refusal(self) -> str | None:
        """Why this model's sessions cannot decode in one step (Model.batch), or None."""
        if not hasattr(self, "_batch_refusal"):
            self._batch_refusal = self._why_no_batch()
        return self._batch_refusal

    def _why_no_batch(self) -> str | None:
        if self.profile != "ggml":
            return f"the {self.profile} profile decodes one session at a time"
        if self.kv.quantized:
            return f"a {self.cache_type} K/V cache decodes one session at a time (batches run over f16 caches)"
        if self.device is not None:
            return "a decode placed on the GPU runs one session at a time"
        from bankml.runtime.session import cache_layouts
        from bankml.ir.ops import STATE_KINDS
        if any(kind in STATE_KINDS for _, kind in cache_layouts(self.generic_graph(self.variants[0]))):
            return f"{self.arch}'s recurrent states decode one session at a time"
        return None

    def batch(self, sessions) -> "SessionBatch":
        """Sessions of this model that decode one token each in one graph run, each row the bits of
        its session's decode alone (runtime/batch.py): model.batch([a, b]).decode([ta, tb])."""
        from bankml.runtime.batch import SessionBatch
        return SessionBatch(self, sessions)

    # ---- weights ----
    def weight(self, name: str) -> np.ndarray:
        """A tensor's bytes as [rows, row_bytes] uint8 (F32 vectors as float32)."""
        w = self._weights.get(name)
        if w is None:
            t = self.gguf.tensors[name]
            raw = self.gguf.tensor_data(name)
            if t.ggml_type == F32:
                w = raw.view(np.float32).reshape(t.shape[::-1])
            else:
                w = raw.reshape(int(np.prod(t.shape[1:])), -1)
            self._weights[name] = w
        return w

    def _refuse_unreadable(self) -> None:
        """The portable profile reads no weight block with an infinite or NaN scale (the decode-
        arithmetic document's Unreadable): refused here, naming the first, before any graph runs.
        Every weight type bankml reads has an integer form (coded.reads)."""
        for name, t in self.gguf.tensors.items():
            if coded.reads(t.ggml_type):
                try:
                    coded.check_readable(self.weight(name), t.ggml_type)
                except quant.Unreadable as e:
                    raise BankmlError(f"{self.path.name}: tensor {name}, {e}: the portable profile cannot read "
                                      f"it (docs/PORTABLE.md, Unreadable)") from None

    def session(self) -> "Session":
        from bankml.runtime.session import Session
        return Session(self)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        from bankml.tokenizer import tokenizer_for
        return tokenizer_for(self).encode(text, add_special=add_special, parse_special=parse_special)

    # ---- lifetime ----
    def close(self) -> None:
        """Release the compiled code, threads, the device's buffers and the file; idempotent."""
        if self.runner is not None:
            self.runner.close()
            self.runner = None
        if self.device is not None:
            self.device.close()
            self.device = None
        self._graphs.clear()
        self._ready.clear()
        self._ready_for.clear()
        self._weights.clear()
        self.gguf = None            # the file's map goes with the last array that views it

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _key(v: Variant, want: str) -> str:
    """A prepared graph's name: the variant's, and its output when that is not the logits."""
    return v.name if want == "logits" else f"{v.name}+{want}"


def load(path, backend: str = "llvm", threads: int | None = None, llama_threads: int | None = None,
         cache_type: str = "f16", n_ubatch: int = 512, n_ctx: int = 4096, gpu: str | int | None = None, arch: str | None = None,
         swa_full: bool = True, cache_type_k: str | None = None, cache_type_v: str | None = None,
         profile: str = "ggml", act_scaling: str = "Sub32") -> Model:
    """Read and plan a GGUF (refusing what bankml does not reproduce, from the header alone).

    cache_type sets the K and V cache types ("f16", "q8_0", "q4_0"); cache_type_k/cache_type_v set
    one of them (llama.cpp's -ctk/-ctv). A quantized cache rotates as b11434 does (kv_cache.py).

    `arch` runs the graph of another registered architecture (bankml.arch.registry) on the
    file's weights, e.g. one defined outside the package (examples/custom_architecture.py);
    when it declares its tensors, plan() checks the file against that declaration.
    `swa_full` (models with sliding-window layers): llama_context_default_params' full-size
    SWA cache (True, what the oracle harness runs) or llama-server's and llama-cli's ring of
    PAD256(n_swa + n_ubatch) cells (False).
    `act_scaling` (profile "portable"): how activations are scaled, the decode-arithmetic
    document's ActScaling: "Sub32" (blocks of 32, m in 8..15; the default) or "PerBlock" (the
    weight's own blocks, m in 128..255; block formats only). docs/PORTABLE.md.
    """
    threads = threads or min(4, os.cpu_count() or 1)
    return Model(path, ModelOptions(backend=backend, threads=threads, llama_threads=llama_threads,
                                    cache_type=cache_type, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                                    n_ubatch=n_ubatch, n_ctx=n_ctx, gpu=gpu, arch=arch, swa_full=swa_full,
                                    profile=profile, act_scaling=act_scaling))
