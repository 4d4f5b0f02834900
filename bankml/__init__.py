"""bankml: a graph compiler for LLM inference, bit-identical to llama.cpp."""
from bankml.errors import BankmlError, CorruptGGUF, ModelRefused
from bankml.runtime.model import Model, load

__version__ = "0.1.0"
__all__ = ["load", "Model", "BankmlError", "CorruptGGUF", "ModelRefused", "__version__"]
