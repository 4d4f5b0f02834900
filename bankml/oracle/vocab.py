"""libllama's vocabulary functions through ctypes, for what the harness does not expose.

    with Vocab("m.gguf") as v:                       # llama_model_load_from_file(vocab_only=true)
        text = v.detokenize([2, 9259], remove_special=True, unparse_special=False)   # bytes
        ids = v.tokenize("text", add_special=True, parse_special=False)
        v.attrs(), v.eog()                           # llama_vocab_get_attr / llama_vocab_is_eog of every id
"""
from __future__ import annotations

import ctypes

from bankml.errors import OracleError
from bankml.oracle.paths import bin_dir

_P, _I32, _B = ctypes.c_void_p, ctypes.c_int32, ctypes.c_bool


class _ModelParams(ctypes.Structure):
    """struct llama_model_params (include/llama.h, b11434)."""
    _fields_ = [("devices", _P), ("tensor_buft_overrides", _P), ("n_gpu_layers", _I32), ("split_mode", ctypes.c_int),
                ("load_mode", ctypes.c_int), ("lazy_mode", ctypes.c_int), ("main_gpu", _I32), ("tensor_split", _P),
                ("progress_callback", _P), ("progress_callback_user_data", _P), ("kv_overrides", _P),
                ("vocab_only", _B), ("check_tensors", _B), ("use_extra_bufts", _B), ("no_host", _B),
                ("no_alloc", _B), ("load_mtp", _B)]


def _lib():
    lib = ctypes.CDLL(str(bin_dir() / "libllama.so"))
    lib.llama_model_default_params.restype = _ModelParams
    lib.llama_model_load_from_file.restype = _P
    lib.llama_model_load_from_file.argtypes = [ctypes.c_char_p, _ModelParams]
    lib.llama_model_get_vocab.restype = _P
    lib.llama_model_get_vocab.argtypes = [_P]
    lib.llama_model_free.argtypes = [_P]
    lib.llama_detokenize.restype = _I32
    lib.llama_detokenize.argtypes = [_P, ctypes.POINTER(_I32), _I32, ctypes.c_char_p, _I32, _B, _B]
    lib.llama_tokenize.restype = _I32
    lib.llama_tokenize.argtypes = [_P, ctypes.c_char_p, _I32, ctypes.POINTER(_I32), _I32, _B, _B]
    lib.llama_log_set.argtypes = [_P, _P]
    lib.llama_vocab_n_tokens.restype = _I32
    lib.llama_vocab_n_tokens.argtypes = [_P]
    for fn, res in (("llama_vocab_get_attr", ctypes.c_int), ("llama_vocab_is_eog", _B)):
        getattr(lib, fn).restype = res
        getattr(lib, fn).argtypes = [_P, _I32]
    lib.llama_backend_init()
    return lib


_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_QUIET = _LOG_CB(lambda level, text, data: None)


class Vocab:
    """One model's vocabulary, loaded by libllama itself (vocab_only)."""

    def __init__(self, path):
        self.lib = _lib()
        self.lib.llama_log_set(ctypes.cast(_QUIET, _P), None)
        mp = self.lib.llama_model_default_params()
        mp.vocab_only = True
        self.model = self.lib.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise OracleError(f"libllama could not load the vocabulary of {path}")
        self.vocab = self.lib.llama_model_get_vocab(self.model)

    def detokenize(self, ids: list[int], remove_special: bool = False, unparse_special: bool = False) -> bytes:
        """llama_detokenize: the bytes it writes."""
        arr = (_I32 * max(len(ids), 1))(*ids)
        cap = 64 + 64 * len(ids)
        for _ in range(2):
            buf = ctypes.create_string_buffer(cap)
            n = self.lib.llama_detokenize(self.vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
            if n >= 0:
                return buf.raw[:n]
            cap = -n
        raise OracleError("llama_detokenize kept asking for more room")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        out = (_I32 * cap)()
        n = self.lib.llama_tokenize(self.vocab, raw, len(raw), out, cap, add_special, parse_special)
        if n < 0:
            raise OracleError("llama_tokenize: output buffer too small")
        return list(out[:n])

    def attrs(self) -> list[int]:
        """llama_vocab_get_attr of every token (llama_token_attr bits)."""
        n = self.lib.llama_vocab_n_tokens(self.vocab)
        return [self.lib.llama_vocab_get_attr(self.vocab, i) for i in range(n)]

    def eog(self) -> set[int]:
        """The ids llama_vocab_is_eog accepts."""
        n = self.lib.llama_vocab_n_tokens(self.vocab)
        return {i for i in range(n) if self.lib.llama_vocab_is_eog(self.vocab, i)}

    def close(self) -> None:
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> "Vocab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
