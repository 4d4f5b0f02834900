"""The architecture DSL: what an architecture file (llama.py, qwen3.py, gemma3.py, or one outside
the package: examples/custom_architecture.py) imports to declare and build its graph."""
from bankml.arch.blocks import AttnInput, Builder, Layer, Weight, mrope_text_refusal
from bankml.arch.registry import COMMON_REFUSALS, Architecture, Key, architecture, llama_tensors, register
from bankml.errors import MissingTensor
from bankml.numerics.floats import inv_sqrtf

__all__ = ["Architecture", "AttnInput", "Builder", "COMMON_REFUSALS", "Key", "Layer", "MissingTensor", "Weight",
           "architecture", "inv_sqrtf", "llama_tensors", "mrope_text_refusal", "register"]
