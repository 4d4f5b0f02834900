"""bankml.load(): a model file read and planned, its generic graphs, a backend, sessions.

A model builds one generic graph per variant (bankml.passes.variants: decode, decode-split,
small/large micro-batches with all or the last rows' logits); the backend compiles each the
first time it is needed (saying so on stderr) and runs it for any size in its range, so no
prompt length and no context length compiles again. `Model.close()` (or `with`) releases the
compiled code, the thread pool, the device and the file.
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
from bankml.arch.registry import builder_for
from bankml.backends import BACKENDS, open_backend
from bankml.errors import BankmlError
from bankml.gguf import read_gguf
from bankml.gguf.plan import plan as make_plan
from bankml.ir.graph import Graph
from bankml.passes.pipeline import run_passes
from bankml.passes.variants import Variant, choose_variant, variants
from bankml.runtime import compile_cache

if TYPE_CHECKING:
    from bankml.runtime.session import Session


class Model:
    def __init__(self, path, backend: str = "llvm", threads: int = 1, llama_threads: int | None = None,
                 cache_type: str = "f16", n_ubatch: int = 512, n_ctx: int = 4096, gpu: str | int | None = None,
                 arch: str | None = None, profile: str = "ggml"):
        if backend not in BACKENDS:
            raise BankmlError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if cache_type != "f16":
            raise BankmlError(f"cache_type {cache_type!r} is not reproduced yet; bankml supports f16")
        if threads < 1 or (llama_threads is not None and llama_threads < 1) or n_ubatch < 1 or n_ctx < 1:
            raise BankmlError("threads, llama_threads, n_ubatch and n_ctx must be positive")
        _check_profile(profile, backend, gpu)
        self.profile = profile          # float orders: "ggml" (llama.cpp's bits) | "portable" (docs/PORTABLE.md)
        self.path = Path(path)
        self.gguf = read_gguf(self.path)
        self.plan = make_plan(self.gguf)
        self.hparams = self.plan.hparams
        self.backend, self.threads = backend, threads
        self.llama_threads = llama_threads or threads
        self.cache_type, self.n_ubatch, self.n_ctx = cache_type, n_ubatch, n_ctx
        self.gpu = gpu              # Q1_0 decode matvecs: None (BANKML_GPU) | "auto" | "off" | index
        self.kv_size = -(-n_ctx // 256) * 256          # llama-context.cpp: n_ctx padded to 256
        self.shapes = {name: t.shape for name, t in self.gguf.tensors.items()}
        self.arch = arch or self.plan.arch          # a registered builder may stand in for the file's
        self._build = builder_for(self.arch)
        self.variants = variants(n_ubatch, self.kv_size)
        self.compile_seconds = 0.0      # time this model spent compiling native code so far (llvm backend)
        self._graphs: dict[str, Graph] = {}         # variant name -> generic graph after the passes
        self._ready: set[str] = set()               # variants the backend has prepared
        self._prepare_lock = threading.Lock()
        self._weights: dict[str, np.ndarray] = {}
        from bankml.runtime.gpu import for_setting
        self.device = for_setting(gpu)              # a ModelGpu (decode's Q1_0 matvecs), or None
        self.runner = open_backend(backend, self.weight, threads, self.device)

    # ---- graphs ----
    def graph(self, n_tokens: int, n_kv: int, n_outputs: int) -> Graph:
        """The concrete IR of one micro-batch after every pass."""
        return run_passes(self.build_graph(n_tokens, n_kv, n_outputs))

    def build_graph(self, n_tokens, n_kv, n_outputs) -> Graph:
        """The IR of one micro-batch as the architecture file builds it, before passes; sizes
        may be numbers or Dims (a generic graph)."""
        b = Builder(self.plan, Batch(n_tokens, n_kv, n_outputs), self.shapes)
        self._build(b)
        g = b.g
        g.meta["llama_threads"] = self.llama_threads
        if self.profile != "ggml":
            g.meta["profile"] = self.profile
        if n_outputs == 0:          # no logits wanted: only the cache writes stay alive
            g.outputs = {}
        return g

    def generic_graph(self, v: Variant) -> Graph:
        """The generic graph of a variant after every pass (built once per model)."""
        if v.name not in self._graphs:
            self._graphs[v.name] = run_passes(self.build_graph(v.n_tokens, v.n_kv, v.n_outputs))
        return self._graphs[v.name]

    def prepare(self, v: Variant) -> float:
        """Make a variant ready to run (the llvm backend compiles it); the seconds that took."""
        with self._prepare_lock:                   # sessions of several threads share the model
            return self._prepare(v)

    def _prepare(self, v: Variant) -> float:
        if v.name in self._ready:
            return 0.0
        t0, misses = time.perf_counter(), compile_cache.counts["miss"]
        self.runner.prepare(self.generic_graph(v))
        seconds = time.perf_counter() - t0
        if self.backend == "llvm":
            self.compile_seconds += seconds
            if compile_cache.counts["miss"] > misses or not compile_cache.enabled():
                why = "first use; cached afterwards" if compile_cache.enabled() else "BANKML_JIT_CACHE is off"
                print(f"bankml: compiled the {v.name} graph of {self.path.name} in {seconds:.1f} s ({why})",
                      file=sys.stderr, flush=True)
        self._ready.add(v.name)
        return seconds

    def compile(self) -> float:
        """Prepare every variant a session can need; afterwards nothing compiles again."""
        return sum(self.prepare(v) for v in self.variants)

    def warm_up(self) -> None:
        """One single-token decode on a throwaway session, as llama.cpp's common_init_from_params
        warms a model up before serving: the weights' pages are mapped and the decode graph's
        buffers touched, so the first request does not pay for it. Changes no state."""
        s = self.session()
        s.decode(self.hparams.n_vocab - 1)

    def n_kv(self, used: int) -> int:
        """Cells the attention reads when `used` cells are filled (llama_kv_cache::get_n_kv: a
        multiple of 256)."""
        return min(self.kv_size, max(256, -(-used // 256) * 256))

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
        return sum(self.prepare(choose_variant(self.variants, *sizes)[0]) for sizes in need)

    def run_ubatch(self, n_tokens: int, n_kv: int, n_outputs: int, inputs: dict, caches: dict, trace=None) -> dict:
        """One micro-batch through the variant that takes these sizes."""
        if self.runner is None:
            raise BankmlError(f"{self.path.name}: the model is closed")
        v, values = choose_variant(self.variants, n_tokens, n_kv, n_outputs)
        self.prepare(v)
        return self.runner.run(self.generic_graph(v), values, inputs, caches, trace)

    # ---- weights ----
    def weight(self, name: str) -> np.ndarray:
        """A tensor's bytes as [rows, row_bytes] uint8 (F32 vectors as float32)."""
        w = self._weights.get(name)
        if w is None:
            t = self.gguf.tensors[name]
            raw = self.gguf.tensor_data(name)
            if t.ggml_type == 0:
                w = raw.view(np.float32).reshape(t.shape[::-1])
            else:
                w = raw.reshape(int(np.prod(t.shape[1:])), -1)
            self._weights[name] = w
        return w

    def session(self) -> "Session":
        from bankml.runtime.session import Session
        return Session(self)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        from bankml.runtime.tokenizer import tokenizer_for
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
        self._weights.clear()
        self.gguf = None            # the file's map goes with the last array that views it

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_profile(profile: str, backend: str, gpu) -> None:
    from bankml.profiles import PROFILES
    if profile not in PROFILES:
        raise BankmlError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    if profile == "portable" and backend != "reference":
        raise BankmlError("profile 'portable' runs on the reference backend only for now (backend='reference')")
    if profile == "portable" and gpu not in (None, "off"):
        raise BankmlError("profile 'portable' has no GPU lowering yet; leave gpu off")


def load(path, backend: str = "llvm", threads: int | None = None, llama_threads: int | None = None,
         cache_type: str = "f16", n_ubatch: int = 512, n_ctx: int = 4096, gpu: str | int | None = None, arch: str | None = None,
         profile: str = "ggml") -> Model:
    """Read and plan a GGUF (refusing what bankml does not reproduce, from the header alone).

    `arch` runs the graph of another registered architecture (bankml.arch.registry) on the
    file's weights, e.g. one defined outside the package (examples/custom_architecture.py).
    """
    threads = threads or min(4, os.cpu_count() or 1)
    return Model(path, backend, threads, llama_threads, cache_type, n_ubatch, n_ctx, gpu, arch, profile)
