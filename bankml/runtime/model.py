"""bankml.load(): a model file read and planned, graphs built per micro-batch shape, sessions."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from bankml.arch.blocks import Batch, Builder
from bankml.arch.registry import builder_for
from bankml.errors import BankmlError
from bankml.gguf import read_gguf
from bankml.gguf.plan import plan as make_plan
from bankml.ir.graph import Graph
from bankml.passes.pipeline import run_passes

BACKENDS = ("reference", "llvm")


class Model:
    def __init__(self, path, backend: str = "llvm", threads: int = 1, llama_threads: int | None = None,
                 cache_type: str = "f16", n_ubatch: int = 512, n_ctx: int = 4096, gpu: str | int | None = None,
                 arch: str | None = None):
        if backend not in BACKENDS:
            raise BankmlError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        if cache_type != "f16":
            raise BankmlError(f"cache_type {cache_type!r} is not reproduced yet; bankml supports f16")
        if threads < 1 or (llama_threads is not None and llama_threads < 1) or n_ubatch < 1 or n_ctx < 1:
            raise BankmlError("threads, llama_threads, n_ubatch and n_ctx must be positive")
        self.path = Path(path)
        self.gguf = read_gguf(self.path)
        self.plan = make_plan(self.gguf)
        self.hparams = self.plan.hparams
        self.backend, self.threads = backend, threads
        if backend == "llvm":
            from bankml.backends.llvm import run as runner
        else:
            from bankml.backends.reference.run import run as runner
        self.runner = runner
        self.llama_threads = llama_threads or threads
        self.cache_type, self.n_ubatch, self.n_ctx = cache_type, n_ubatch, n_ctx
        self.gpu = gpu              # Q1_0 decode matvecs: None (BANKML_GPU) | "auto" | "off" | index
        self.kv_size = -(-n_ctx // 256) * 256          # llama-context.cpp: n_ctx padded to 256
        self.shapes = {name: t.shape for name, t in self.gguf.tensors.items()}
        self.arch = arch or self.plan.arch          # a registered builder may stand in for the file's
        self._build = builder_for(self.arch)
        self.compile_seconds = 0.0      # time this model spent compiling native code so far (llvm backend)

    # ---- graphs ----
    @functools.lru_cache(maxsize=64)
    def graph(self, n_tokens: int, n_kv: int, n_outputs: int, outputs_in_order: bool = True) -> Graph:
        """The IR of one micro-batch after every pass (cached by shape)."""
        return run_passes(self.build_graph(n_tokens, n_kv, n_outputs, outputs_in_order))

    def build_graph(self, n_tokens: int, n_kv: int, n_outputs: int, outputs_in_order: bool = True) -> Graph:
        """The IR of one micro-batch as the architecture file builds it, before passes."""
        b = Builder(self.plan, Batch(n_tokens, n_kv, n_outputs), self.shapes)
        self._build(b)
        g = b.g
        g.meta.update(llama_threads=self.llama_threads, outputs_in_order=outputs_in_order)
        if n_outputs == 0:          # no logits wanted: only the cache writes stay alive
            g.outputs = {}
        return g

    # ---- weights ----
    @functools.lru_cache(maxsize=None)
    def weight(self, name: str) -> np.ndarray:
        """A tensor's bytes as [rows, row_bytes] uint8 (F32 vectors as float32)."""
        t = self.gguf.tensors[name]
        raw = self.gguf.tensor_data(name)
        if t.ggml_type == 0:
            return raw.view(np.float32).reshape(t.shape[::-1])
        rows = int(np.prod(t.shape[1:]))
        return raw.reshape(rows, -1)

    def session(self) -> "Session":
        from bankml.runtime.session import Session
        return Session(self)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        from bankml.runtime.tokenizer import tokenizer_for
        return tokenizer_for(self).encode(text, add_special=add_special, parse_special=parse_special)


def load(path, backend: str = "llvm", threads: int | None = None, llama_threads: int | None = None,
         cache_type: str = "f16", n_ubatch: int = 512, n_ctx: int = 4096, gpu: str | int | None = None, arch: str | None = None) -> Model:
    """Read and plan a GGUF (refusing what bankml does not reproduce, from the header alone).

    `arch` runs the graph of another registered architecture (bankml.arch.registry) on the
    file's weights, e.g. one defined outside the package (examples/custom_architecture.py).
    """
    threads = threads or min(4, os.cpu_count() or 1)
    return Model(path, backend, threads, llama_threads, cache_type, n_ubatch, n_ctx, gpu, arch)
