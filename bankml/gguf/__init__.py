"""GGUF: bankml's own guarded reader and the header-only plan (what to build, or a refusal)."""
from bankml.gguf.plan import HParams, Plan, plan
from bankml.gguf.reader import GGUFFile, TensorInfo, ggml_type_name, read_gguf

__all__ = ["GGUFFile", "HParams", "Plan", "TensorInfo", "ggml_type_name", "plan", "read_gguf"]
