"""One tree of errors. A message names the thing, the reason and the way out."""


class BankmlError(Exception):
    """Anything bankml refuses or cannot do; the CLI prints it as one line."""


class CorruptGGUF(BankmlError):
    """The file is not a well-formed GGUF (truncated, hostile or inconsistent)."""


class ModelRefused(BankmlError):
    """A well-formed model whose graph bankml does not reproduce (named key or tensor, and why)."""


class MissingTensor(ModelRefused, AttributeError):
    """An architecture's graph asks for a tensor the file does not have (named); an AttributeError
    too, so `getattr(layer, "attn_q_norm", None)` tests whether a file has a tensor."""


class LoweringError(BankmlError):
    """A backend has no lowering for a node (op, node name, backend)."""


class SpecError(BankmlError):
    """An IR graph breaks its own rules: a bankml bug, naming the node."""


class OracleError(BankmlError):
    """The llama.cpp reference build or its harness failed."""
