"""Architectures by name. A new one is a Python file that decorates its builder function:

    @architecture("myarch")
    def build_myarch(b: Builder) -> None: ...

`plan()` accepts the architectures the reader knows; `register` lets a user file add one.
"""
from __future__ import annotations

from typing import Callable

from bankml.errors import ModelRefused

ARCHITECTURES: dict[str, Callable] = {}


def architecture(name: str) -> Callable:
    def register(fn: Callable) -> Callable:
        ARCHITECTURES[name] = fn
        return fn
    return register


def builder_for(arch: str) -> Callable:
    import bankml.arch.llama  # noqa: F401  (registers)
    import bankml.arch.qwen3  # noqa: F401
    if arch not in ARCHITECTURES:
        raise ModelRefused(f"architecture {arch!r} has no graph builder; known: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[arch]
