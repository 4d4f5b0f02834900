"""GGUF: bankml's own guarded reader (every count checked against the bytes left)."""
from bankml.gguf.reader import GGUFFile, TensorInfo, ggml_type_name, read_gguf

__all__ = ["GGUFFile", "TensorInfo", "ggml_type_name", "read_gguf"]
