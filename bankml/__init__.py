"""bankml: a graph compiler for LLM inference, bit-identical to llama.cpp."""
from bankml._version import __version__
from bankml.errors import BankmlError, CorruptGGUF, ModelRefused
from bankml.runtime.model import Model, load

__all__ = ["load", "Model", "BankmlError", "CorruptGGUF", "ModelRefused", "__version__"]
