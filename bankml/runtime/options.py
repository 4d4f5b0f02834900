"""What a model is loaded with besides its file: one frozen, checked object.

    opts = ModelOptions(backend="llvm", threads=2, cache_type="q8_0")   # or BankmlError
    m = Model("model.gguf", opts)                   # bankml.load(path, **fields) makes both

The defaults are llama.cpp's (common_params and llama_context_default_params: n_ctx 4096,
n_ubatch 512, an f16 K/V cache, swa_full); bankml.load picks the thread count when given none.
Everything that can be checked without the file is checked here, once; the checks that need
the file (the cache types against the head size, the portable profile against the
architecture) are the model's.
"""
from __future__ import annotations

from dataclasses import dataclass

from bankml.backends import BACKENDS
from bankml.errors import BankmlError
from bankml.profiles import PROFILES


@dataclass(frozen=True)
class ModelOptions:
    backend: str = "llvm"                   # "reference" | "llvm"
    threads: int = 1                        # bankml's threads
    llama_threads: int | None = None        # llama.cpp's n_threads (split-KV chunks), default: threads
    cache_type: str = "f16"                 # K and V cache type (-ctk/-ctv at once)
    cache_type_k: str | None = None         # -ctk, default: cache_type
    cache_type_v: str | None = None         # -ctv, default: cache_type
    n_ubatch: int = 512                     # tokens per micro-batch
    n_ctx: int = 4096                       # context cells (padded to 256 by the model)
    gpu: str | int | None = None            # Q1_0 decode matvecs: None (BANKML_GPU) | "auto" | "off" | index
    arch: str | None = None                 # a registered architecture to run instead of the file's
    swa_full: bool = True                   # the sliding-window layers' cache at full size
    profile: str = "ggml"                   # float orders: "ggml" (llama.cpp's bits) | "portable"
    act_scaling: str = "Sub32"              # the portable profile's ActScaling: "Sub32" | "PerBlock"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise BankmlError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if (self.threads < 1 or (self.llama_threads is not None and self.llama_threads < 1)
                or self.n_ubatch < 1 or self.n_ctx < 1):
            raise BankmlError("threads, llama_threads, n_ubatch and n_ctx must be positive")
        if self.profile not in PROFILES:
            raise BankmlError(f"unknown profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        if self.profile == "portable" and self.backend not in ("reference", "llvm"):
            raise BankmlError(f"profile 'portable' runs on the reference and llvm backends, not {self.backend!r}")
        if self.act_scaling not in ("Sub32", "PerBlock"):
            raise BankmlError(f"unknown act_scaling {self.act_scaling!r}; choose Sub32 or PerBlock")
        if self.act_scaling != "Sub32" and self.profile != "portable":
            raise BankmlError(f"act_scaling {self.act_scaling} is the portable profile's; add profile='portable'")
        if self.profile == "portable" and self.gpu not in (None, "off"):
            raise BankmlError("profile 'portable' has no GPU lowering yet; leave gpu off")
