"""The IR verifier (bankml/ir/verify.py): every graph the real models make keeps the IR's
rules after every pass; a graph that breaks one is refused naming the node, the pass and the rule."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import bankml
from bankml.errors import SpecError
from bankml.ir import order as fo
from bankml.ir import verify
from bankml.ir.dims import Dim
from bankml.ir.ops import Op
from bankml.passes import pipeline
from bankml.passes.pipeline import TYPES, passes_of, run_passes
from bankml.testing import models

VOCAB_ONLY = {"gemma3-vocab-prefix", "smollm2-vocab-specials"}
RUNNABLE = [m for m in models.MODELS if m not in models.ON_REQUEST and m not in VOCAB_ONLY]
# (profile, K cache, V cache): ggml with an f16 cache, quantized K and V (both Hadamard rotations),
# a quantized K alone, and the portable profile (llama, qwen3 and qwen35)
CONFIGS = [("ggml", "f16", "f16"), ("ggml", "q8_0", "q4_0"), ("ggml", "q4_0", "f16"), ("portable", "f16", "f16")]
# every model with the f16 cache (every weight type); the other configurations on one model per
# architecture and shape (the weight types change nothing there)
CASES = [(m, *CONFIGS[0]) for m in RUNNABLE] + [
    (m, *c) for m in ("smollm2-q4_1", "llama-gqa-f16", "qwen3-small-q1_0", "gemma3-tiny-w48-q8_0",
                      "gemma3-270m-q4_k_m", "qwen35-small-q4_k_m") for c in CONFIGS[1:]
    if not (c[0] == "portable" and m.startswith(("gemma3", "qwen35")))] + [("qwen35-small-q1_0", *CONFIGS[3])]


def _steps(g):
    """The builder's graph, then the graph after each pass, each with the pass's name."""
    yield "the builder", g
    for p in passes_of(g):
        g = p(g)
        yield p.__name__, g


@pytest.mark.parametrize("name,profile,k,v", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_every_variant_of_every_model_verifies_after_every_pass(name, profile, k, v):
    with bankml.load(models.path(name), backend="reference", profile=profile, cache_type_k=k, cache_type_v=v,
                     n_ctx=1024) as m:
        built = [m.build_graph(x.n_tokens, x.n_kv, x.n_outputs, x.n_kv_swa) for x in m.variants]
        built += [m.build_graph(7, 256, 1), m.build_graph(5, 512, 5), m.build_graph(64, 256, 0)]
        for g0 in built:
            for after, g in _steps(g0):
                verify.check(g, after, TYPES)


def test_every_op_has_a_rule():
    assert set(verify.RULES) == set(Op)


# ---- broken graphs ----
@pytest.fixture(scope="module")
def qwen():
    """qwen3-small (Q1_0) with a q8_0 K and q4_0 V cache: quantized activations and Hadamard rotations."""
    with bankml.load(models.path("qwen3-small-q1_0"), backend="reference", cache_type_k="q8_0",
                     cache_type_v="q4_0") as m:
        yield m


def _one(g, op, name=None):
    return next(n for n in g.nodes.values() if n.op is op and (name is None or n.name == name))


def _set(g, n, **kw):
    g.nodes[n.id] = n.replace(**kw)
    return n


def _refused(g, after, node, *words):
    with pytest.raises(SpecError) as e:
        verify.check(g, after, TYPES)
    msg = str(e.value)
    assert msg.startswith(f"after {after}: ") and "a bankml bug" in msg
    if node is not None:
        assert f"%{node.id} {node.name or '-'} ({node.op.value} " in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_refuses_wrong_arity(qwen):
    g = qwen.graph(7, 256, 1)
    norm = _one(g, Op.RMS_NORM, "norm-0")
    _set(g, norm, inputs=(*norm.inputs, norm.inputs[0]))
    _refused(g, "remove_dead_nodes", norm, "rms_norm takes 1 input, it has 2")


def test_refuses_a_leaf_with_an_input(qwen):
    g = qwen.graph(7, 256, 1)
    w = _one(g, Op.WEIGHT, "blk.0.attn_q.weight")
    _set(g, w, inputs=(0,))
    _refused(g, "remove_dead_nodes", w, "weight takes 0 inputs, it has 1")


def test_refuses_mul_mat_k_mismatch(qwen):
    g = qwen.graph(7, 256, 1)
    q, down = _one(g, Op.MUL_MAT, "Qcur-0"), _one(g, Op.MUL_MAT, "ffn_out-0")
    _set(g, q, inputs=(down.inputs[0], q.inputs[1]))        # ffn_down's weight [512, 1536] on a row of 512
    _refused(g, "choose_matmul_kernel", q, "has not the weight's K 1536")


def test_refuses_an_f16_activation(qwen):
    g = qwen.graph(7, 256, 1)
    norm = _set(g, _one(g, Op.RMS_NORM, "norm-0"), dtype="f16")
    _refused(g, "remove_dead_nodes", norm, "is f16, not an f32 activation")


def test_refuses_a_cache_type_bankml_does_not_run(qwen):
    g = qwen.graph(7, 256, 1)
    cache = _set(g, _one(g, Op.CACHE), dtype="q5_1")
    _refused(g, "remove_dead_nodes", cache, "a cache is one of f16, i8r, q4_0, q8_0")


def test_refuses_an_activation_quantized_for_another_weight_type(qwen):
    g = qwen.graph(7, 256, 1)
    q = _one(g, Op.MUL_MAT, "Qcur-0")
    x = g[q.inputs[1]]
    _set(g, x, dtype="F16", params={**x.params, "type": 1})
    _refused(g, "share_quantized_activations", q, "is F16, not Q1_0's vec_dot type Q8_0")


def test_refuses_an_input_after_its_user(qwen):
    g = qwen.build_graph(7, 256, 1)          # the builder's ids: an input's id below its user's
    attn_norm, q = _one(g, Op.MUL, "attn_norm-0"), _one(g, Op.MUL_MAT, "Qcur-0")
    _set(g, attn_norm, inputs=(q.id, attn_norm.inputs[1]))
    _refused(g, "the builder", attn_norm, f"input %{q.id} is computed after it")


def test_refuses_a_dangling_output(qwen):
    g = qwen.graph(7, 256, 1)
    g.outputs["logits"] = 10**6
    msg = _refused(g, "remove_dead_nodes", None, "output 'logits' is %1000000, which is not in the graph")
    assert msg.startswith("after remove_dead_nodes: output 'logits'")      # no node to name but the output


def test_refuses_a_missing_input(qwen):
    g = qwen.graph(7, 256, 1)
    q = _one(g, Op.MUL_MAT, "Qcur-0")
    del g.nodes[q.inputs[0]]
    _refused(g, "remove_dead_nodes", q, f"input %{q.inputs[0]} is not in the graph")


def test_refuses_a_leaf_with_a_float_order(qwen):
    g = qwen.graph(7, 256, 1)
    cache = _set(g, _one(g, Op.CACHE), order=fo.ELEMENTWISE)
    _refused(g, "remove_dead_nodes", cache, "a leaf computes nothing but has a float order")


def test_refuses_a_view_of_another_size(qwen):
    g = qwen.graph(7, 256, 1)
    r = _one(g, Op.RESHAPE, "Qcur-0")
    _set(g, r, shape=(7, 4, 64))
    _refused(g, "remove_dead_nodes", r, "holds another number of elements")


def _small_last(m):
    """A fresh generic graph of the small-last variant (T tokens, O output rows)."""
    v = next(v for v in m.variants if v.name == "small-last")
    return run_passes(m.build_graph(v.n_tokens, v.n_kv, v.n_outputs)), v


def test_refuses_a_generic_view_that_swaps_sizes(qwen):
    """[O,4,128] may not view [T,512], whatever T and O may be."""
    g, _ = _small_last(qwen)
    r = _one(g, Op.RESHAPE, "Qcur-0")
    assert isinstance(r.shape[0], Dim) and r.shape[0].name == "T"
    _set(g, r, shape=(Dim("O", 0, 1), 4, 128))
    _refused(g, "remove_dead_nodes", r, "holds another number of elements")


def test_refuses_logits_of_the_wrong_rows(qwen):
    g, v = _small_last(qwen)
    out = g[g.outputs["logits"]]
    _set(g, out, shape=(v.n_tokens, out.shape[1]))
    _refused(g, "remove_dead_nodes", out, f"not [O,{out.shape[1]}]")


def test_refuses_cache_cells_that_are_not_positions(qwen):
    g = qwen.graph(7, 256, 1)
    sr = _one(g, Op.SET_ROWS)
    mask = _one(g, Op.INPUT, "attn_inp_kq_mask")
    _set(g, sr, inputs=(*sr.inputs[:2], mask.id))
    _refused(g, "remove_dead_nodes", sr, "are not one i32 per row of src1")


def test_refuses_an_attention_mask_of_other_cells(qwen):
    g = qwen.graph(7, 256, 1)
    mask = _set(g, _one(g, Op.INPUT, "attn_inp_kq_mask"), shape=(7, 512))
    _refused(g, "remove_dead_nodes", mask, "has 512 where the graph's n_kv is 256")
    g = qwen.graph(7, 256, 1)
    fa = _one(g, Op.FLASH_ATTN)
    _set(g, fa, inputs=(*fa.inputs[:3], _one(g, Op.INPUT, "inp_pos").id))
    _refused(g, "remove_dead_nodes", fa, "is i32 [7], not f16 [7,256]")


def test_refuses_a_hadamard_size_that_is_no_power_of_two(qwen):
    g = qwen.graph(7, 256, 1)
    h = _one(g, Op.HADAMARD)
    _set(g, h, params={**h.params, "n": 48})
    _refused(g, "remove_dead_nodes", h, "size 48 is not a power of 2")


# ---- the hook ----
def test_run_passes_names_the_pass_that_broke_the_graph(qwen, monkeypatch):
    def drop_the_q_weight(g):
        g = g.map(lambda n: None)
        del g.nodes[_one(g, Op.WEIGHT, "blk.0.attn_q.weight").id]
        return g
    monkeypatch.setattr(pipeline, "PASSES", [*pipeline.PASSES[:2], drop_the_q_weight, *pipeline.PASSES[2:]])
    with pytest.raises(SpecError, match=r"^after drop_the_q_weight: %\d+ Qcur-0 \(mul_mat .*is not in the graph"):
        qwen.graph(7, 256, 1)


def test_the_suite_verifies_every_graph():
    """tests/conftest.py turns the verifier on for every test, and for the processes they start."""
    assert os.environ.get("BANKML_VERIFY") == "1" and verify.enabled()
    out = subprocess.run([sys.executable, "-c", "from bankml.ir import verify; print(verify.enabled())"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


@pytest.mark.parametrize("debug,switch,on", [("0", "0", False), ("1", "0", True), ("0", "1", True), ("", "", False)])
def test_verifier_runs_at_debug_1_or_with_its_switch(monkeypatch, debug, switch, on):
    monkeypatch.setenv("BANKML_DEBUG", debug)
    monkeypatch.setenv("BANKML_VERIFY", switch)
    assert verify.enabled() is on
