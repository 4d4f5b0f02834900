"""The passes decide what llama.cpp decides."""
from __future__ import annotations

import pytest

import bankml
from bankml.ir import order as fo
from bankml.ir.ops import Op
from bankml.passes.choose_attention_kernel import attention_order
from bankml.passes.choose_matmul_kernel import matmul_order
from bankml.passes.pipeline import run_passes
from bankml.testing import models


@pytest.fixture(scope="module")
def qwen():
    return bankml.load(models.path("qwen3-small-q1_0"), threads=1, llama_threads=3)


@pytest.mark.parametrize("n_tokens,n_kv,want", [
    (1, 256, fo.FA_REFERENCE), (1, 512, fo.FA_SPLIT), (1, 1280, fo.FA_SPLIT), (2, 512, fo.FA_REFERENCE),
    (63, 256, fo.FA_REFERENCE), (64, 256, fo.FA_TILED), (512, 768, fo.FA_TILED)])
def test_attention_kernel_rule(n_tokens, n_kv, want):
    assert attention_order(n_tokens, n_kv) is want


def test_split_kernel_gets_llama_threads(qwen):
    g = qwen.graph(1, 512, 1)
    fa = [n for n in g if n.op is Op.FLASH_ATTN]
    assert fa and all(n.order is fo.FA_SPLIT and n.params["n_threads"] == 3 for n in fa)


@pytest.mark.parametrize("wtype,rows,cols,want", [
    (1, 49152, 1, fo.F16_VEC_DOT), (1, 49152, 2, fo.F16_TINYBLAS), (1, 49154, 7, fo.F16_VEC_DOT),
    (8, 576, 1, fo.Q8_0_DOT), (8, 576, 9, fo.Q8_0_DOT), (3, 576, 9, fo.Q4_1_DOT),
    (41, 512, 9, fo.Q1_0_DOT), (42, 512, 1, fo.Q2_0_DOT),
    (12, 640, 1, fo.Q4_K_REPACK), (12, 640, 9, fo.Q4_K_REPACK), (12, 36, 9, fo.Q4_K_MUL_MAT),
    (14, 640, 1, fo.Q6_K_MUL_MAT), (14, 640, 9, fo.Q6_K_MUL_MAT)])
def test_matmul_path_rule(wtype, rows, cols, want):
    assert matmul_order(wtype, rows, cols) is want


def test_qkv_share_one_quantized_activation_and_gate_up_another(qwen):
    g = qwen.graph(7, 256, 7)
    mm = {n.name: n for n in g if n.op is Op.MUL_MAT and n.name}
    assert mm["Qcur-0"].inputs[1] == mm["Kcur-0"].inputs[1] == mm["Vcur-0"].inputs[1]
    assert mm["ffn_up-0"].inputs[1] == mm["ffn_gate-0"].inputs[1]
    assert mm["Qcur-0"].inputs[1] != mm["ffn_up-0"].inputs[1]
    assert g[mm["Qcur-0"].inputs[1]].op is Op.QUANTIZE
    assert len([n for n in g if n.op is Op.QUANTIZE]) == 4 * 4 + 1     # qkv, wo, gate/up, down per layer + logits


def test_last_layer_runs_only_output_rows(qwen):
    g = qwen.graph(7, 256, 1)
    assert g[g.outputs["logits"]].shape == (1, 49152)
    assert [n.shape for n in g if n.name == "ffn_out-3"] == [(1, 512)]
    assert [n.shape for n in g if n.name == "ffn_out-2"] == [(7, 512)]


def test_all_rows_wanted_drops_the_gather(qwen):
    before = qwen.build_graph(7, 256, 7)
    after = qwen.graph(7, 256, 7)
    gathers = lambda g: [n for n in g if n.op is Op.GET_ROWS and g[n.inputs[0]].op is not Op.WEIGHT]
    assert len(gathers(before)) == 2 and gathers(after) == []


def test_no_outputs_keeps_only_cache_writes(qwen):
    g = run_passes(qwen.build_graph(64, 256, 0))
    assert not g.outputs
    assert not any(n.name == "result_norm" for n in g)
    assert len([n for n in g if n.op is Op.SET_ROWS]) == 2 * 4
