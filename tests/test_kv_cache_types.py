"""The K/V cache's types: llama.cpp's rotation sizes, its refusals, and bankml's, as one line each."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import bankml
from bankml.errors import BankmlError
from bankml.ir.ops import Op
from bankml.quants.kv_cache import I8_ROWS, KvCacheTypes, cache_array
from bankml.testing import models


@pytest.mark.parametrize("k,v,head,rot", [("q8_0", "q8_0", 64, (64, 64)), ("q8_0", "q8_0", 128, (128, 64)),
                                          ("q4_0", "f16", 128, (128, 0)), ("f16", "q4_0", 64, (0, 64)),
                                          ("f16", "f16", 128, (0, 0)), ("q8_0", "q8_0", 96, (0, 0)),
                                          ("q8_0", "q8_0", 256, (256, 64)), ("q8_0", "q8_0", 192, (64, 64)),
                                          ("q4_0", "q8_0", 160, (0, 0))])
def test_rotation_sizes_follow_llama_kv_cache(monkeypatch, k, v, head, rot):
    """n_rot_k from 64, doubling while it divides the head; n_rot_v 64; none unless head % 64 == 0."""
    monkeypatch.delenv("LLAMA_ATTN_ROT_DISABLE", raising=False)
    kv = KvCacheTypes.of(k, v, head)
    assert (kv.rot_k, kv.rot_v) == rot


@pytest.mark.parametrize("value,off", [("1", True), ("0", False), ("", False), ("2x", True), ("x", False)])
def test_llama_attn_rot_disable_is_read_as_atoi(monkeypatch, value, off):
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", value)
    assert KvCacheTypes.of("q8_0", "q8_0", 64).rot_k == (0 if off else 64)


def test_bytes_per_cell():
    assert KvCacheTypes.of("f16", "f16", 64).cell_bytes(30, 3, 64) == 30 * 2 * 192 * 2
    assert KvCacheTypes.of("q8_0", "q8_0", 64).cell_bytes(30, 3, 64) == 30 * 2 * 6 * 34
    assert KvCacheTypes.of("q4_0", "f16", 64).cell_bytes(30, 3, 64) == 30 * (6 * 18 + 384)


@pytest.mark.parametrize("k,v,why", [("q4_1", "f16", "K cache type 'q4_1' is llama.cpp's but not reproduced"),
                                     ("f16", "bf16", "V cache type 'bf16' is llama.cpp's but not reproduced"),
                                     ("q9", "f16", "K cache type 'q9' is not a llama.cpp cache type")])
def test_unsupported_cache_types_are_refused_with_the_reason(k, v, why):
    with pytest.raises(BankmlError, match=why):
        KvCacheTypes.of(k, v, 64)


def test_a_block_that_does_not_divide_the_head_is_refused():
    with pytest.raises(BankmlError, match="block size 32 does not divide the head size 48"):
        KvCacheTypes.of("q8_0", "f16", 48)


def test_load_refuses_before_anything_runs_and_sessions_hold_block_bytes():
    with pytest.raises(BankmlError, match="q5_0"):
        bankml.load(models.path("qwen3-small-q1_0"), backend="reference", cache_type="q5_0")
    with bankml.load(models.path("qwen3-small-q1_0"), backend="reference", cache_type_k="q4_0",
                     cache_type_v="f16", n_ctx=300) as m:
        assert (m.cache_type_k, m.cache_type_v, m.cache_type) == ("q4_0", "f16", "q4_0,f16")
        s = m.session()
        assert s.caches[(0, "k")].shape == (512, 2 * 128 // 32 * 18) and s.caches[(0, "k")].dtype == np.uint8
        assert s.caches[(0, "v")].shape == (512, 2, 128) and s.caches[(0, "v")].dtype == np.float16
        assert m.cache_bytes() == 512 * 4 * (144 + 512)


def bankml_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bankml.cli", *args], capture_output=True, text=True, timeout=600)


def test_info_states_the_cache_size():
    r = bankml_cli("info", str(models.path("smollm2-q4_1")), "-ctk", "q8_0", "-ctv", "q8_0")
    assert r.returncode == 0, r.stderr
    assert ("K/V cache: K q8_0, V q8_0 (Hadamard rotation K 64, V 64); 12240 bytes per cell, 4096 cells: 47.81 MiB"
            in r.stdout)


def test_run_with_an_unsupported_cache_type_is_one_error_line():
    r = bankml_cli("run", str(models.path("qwen3-small-q1_0")), "--raw", "-p", "Hi", "-n", "1", "-ctk", "iq4_nl")
    assert r.returncode == 1 and r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "iq4_nl" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("dtype,shape,dt", [("f16", (512, 2, 128), np.float16),
                                            ("q8_0", (512, 2 * 128 // 32 * 34), np.uint8),
                                            ("q4_0", (512, 2 * 128 // 32 * 18), np.uint8)])
def test_cache_array_lays_out_each_type(dtype, shape, dt):
    assert cache_array(dtype, (512, 2, 128)) == (shape, np.dtype(dt))


def test_cache_array_of_the_portable_rows_is_one_f16_scale_and_the_codes_per_head():
    shape, dt = cache_array(I8_ROWS, (512, 2, 128))
    assert shape == (512, 2) and dt.names == ("d", "qs") and dt.itemsize == 2 + 128


def test_a_session_allocates_what_the_graphs_cache_nodes_say():
    with bankml.load(models.path("gemma3-tiny-w48-f16"), backend="reference", n_ctx=2048, swa_full=False) as m:
        g = m.generic_graph(m.variants[0])
        caches = m.session().caches
        assert set(caches) == {(il, kind) for il in range(m.hparams.n_layer) for kind in "kv"}
        for n in g:
            if n.op is Op.CACHE:
                want = m.kv_size_swa if m.hparams.is_swa(n.params["layer"]) else m.kv_size
                assert n.params["cells"] == want == caches[(n.params["layer"], n.params["kind"])].shape[0]
        assert m.kv_size_swa < m.kv_size
