"""llama.cpp with llama-server's sliding-window cache (`swa_full = false`), through ctypes.

The oracle harness (harness.c) runs `llama_context_default_params`, whose SWA cache is full
size (`swa_full = true`). llama-server and llama-cli use common_params' `swa_full = false`: the
sliding-window layers get a cache of PAD256(n_swa + n_ubatch) cells, reused as a ring. This
module runs that configuration through libllama itself: a prefill (last row) then one-token
decodes, returning every logits row, like `oracle.logits(..., outputs="last", decode_from=...)`.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from bankml.oracle.paths import bin_dir

_P, _I32, _U32, _F, _B = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32, ctypes.c_float, ctypes.c_bool


class ContextParams(ctypes.Structure):
    """struct llama_context_params (include/llama.h, b11434)."""
    _fields_ = [("n_ctx", _U32), ("n_batch", _U32), ("n_ubatch", _U32), ("n_seq_max", _U32), ("n_rs_seq", _U32),
                ("n_outputs_max", _U32), ("n_outputs_max_per_seq", _U32), ("n_threads", _I32),
                ("n_threads_batch", _I32), ("ctx_type", _I32), ("rope_scaling_type", _I32), ("pooling_type", _I32),
                ("attention_type", _I32), ("flash_attn_type", _I32), ("rope_freq_base", _F),
                ("rope_freq_scale", _F), ("yarn_ext_factor", _F), ("yarn_attn_factor", _F), ("yarn_beta_fast", _F),
                ("yarn_beta_slow", _F), ("yarn_orig_ctx", _U32), ("defrag_thold", _F), ("cb_eval", _P),
                ("cb_eval_user_data", _P), ("type_k", _I32), ("type_v", _I32), ("abort_callback", _P),
                ("abort_callback_data", _P), ("embeddings", _B), ("offload_kqv", _B), ("no_perf", _B),
                ("op_offload", _B), ("swa_full", _B), ("kv_unified", _B), ("samplers", _P), ("n_samplers", ctypes.c_size_t),
                ("ctx_other", _P)]


class ModelParams(ctypes.Structure):
    """struct llama_model_params (include/llama.h, b11434)."""
    _fields_ = [("devices", _P), ("tensor_buft_overrides", _P), ("n_gpu_layers", _I32), ("split_mode", _I32),
                ("load_mode", _I32), ("lazy_mode", _I32), ("main_gpu", _I32), ("tensor_split", _P),
                ("progress_callback", _P), ("progress_callback_user_data", _P), ("kv_overrides", _P),
                ("vocab_only", _B), ("check_tensors", _B), ("use_extra_bufts", _B), ("no_host", _B),
                ("no_alloc", _B), ("load_mtp", _B)]


class Batch(ctypes.Structure):
    _fields_ = [("n_tokens", _I32), ("token", ctypes.POINTER(_I32)), ("embd", _P), ("pos", _P), ("n_seq_id", _P),
                ("seq_id", _P), ("logits", _P)]


@functools.cache
def _lib() -> ctypes.CDLL:
    L = ctypes.CDLL(str(bin_dir() / "libllama.so"))
    L.llama_backend_init()
    L.llama_model_default_params.restype = ModelParams
    L.llama_context_default_params.restype = ContextParams
    L.llama_model_load_from_file.restype, L.llama_model_load_from_file.argtypes = _P, [ctypes.c_char_p, ModelParams]
    L.llama_init_from_model.restype, L.llama_init_from_model.argtypes = _P, [_P, ContextParams]
    L.llama_batch_get_one.restype, L.llama_batch_get_one.argtypes = Batch, [ctypes.POINTER(_I32), _I32]
    L.llama_decode.restype, L.llama_decode.argtypes = _I32, [_P, Batch]
    L.llama_get_logits_ith.restype, L.llama_get_logits_ith.argtypes = ctypes.POINTER(_F), [_P, _I32]
    L.llama_model_get_vocab.restype, L.llama_model_get_vocab.argtypes = _P, [_P]
    L.llama_vocab_n_tokens.restype, L.llama_vocab_n_tokens.argtypes = _I32, [_P]
    L.llama_free.argtypes, L.llama_model_free.argtypes = [_P], [_P]
    return L


def logits(model, tokens, decode_from: int, threads: int = 2, n_ubatch: int = 512, n_ctx: int = 4096,
           swa_full: bool = False) -> np.ndarray:
    """The last row of a prefill of tokens[:decode_from], then one row per single-token decode."""
    L = _lib()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model_p = L.llama_model_load_from_file(str(model).encode(), mp)
    if not model_p:
        raise RuntimeError(f"llama.cpp cannot load {model}")
    cp = L.llama_context_default_params()
    assert cp.n_ubatch == 512 and cp.swa_full and cp.n_batch == 2048, "llama_context_params layout differs"
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, max(decode_from, n_ubatch), n_ubatch, 1
    cp.n_threads = cp.n_threads_batch = threads
    cp.no_perf, cp.swa_full = True, swa_full
    ctx = L.llama_init_from_model(model_p, cp)
    try:
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model_p))
        toks = (_I32 * len(tokens))(*tokens)
        rows = []
        for start, n in [(0, decode_from)] + [(i, 1) for i in range(decode_from, len(tokens))]:
            b = L.llama_batch_get_one(ctypes.cast(ctypes.byref(toks, 4 * start), ctypes.POINTER(_I32)), n)
            if L.llama_decode(ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            rows.append(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (n_vocab,)).copy())
        return np.stack(rows)
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model_p)
