"""Generic graphs: a model's variants cover every micro-batch a session runs, and each one,
made concrete for a size in its range, is the graph the passes build for that size."""
from __future__ import annotations

import pytest

import bankml
from bankml.ir.dims import Dim
from bankml.ir.printer import dump
from bankml.passes.variants import choose_variant, variants
from bankml.testing import models


@pytest.fixture(scope="module", params=["smollm2-f16", "qwen3-small-q1_0", "gemma3-tiny-w48-q8_0"])
def model(request):
    m = bankml.load(models.path(request.param), backend="reference", n_ctx=2048)
    yield m
    m.close()


def _nodes(g):
    return [(n.id, n.op, n.inputs, n.shape, n.dtype, n.name, n.order, repr(sorted(n.params.items()))) for n in g]


# (n_tokens, n_kv, n_outputs, variant)
CASES = [(1, 256, 1, "decode"), (1, 512, 1, "decode-split"), (1, 2048, 1, "decode-split"),
         (2, 256, 2, "small-all"), (7, 768, 7, "small-all"), (63, 256, 1, "small-last"), (5, 512, 0, "small-last"),
         (64, 256, 64, "large-all"), (300, 1024, 300, "large-all"), (512, 512, 1, "large-last"),
         (88, 768, 0, "large-last")]


@pytest.mark.parametrize("n_tokens,n_kv,n_outputs,name", CASES, ids=[f"{c[3]}-{c[0]}x{c[1]}o{c[2]}" for c in CASES])
def test_variant_made_concrete_is_the_graph_of_that_size(model, n_tokens, n_kv, n_outputs, name):
    v, values = choose_variant(model.variants, n_tokens, n_kv, n_outputs)
    assert v.name == name
    generic = model.generic_graph(v)
    if n_outputs == 0:      # the concrete graph drops the logits; the variant computes and discards them
        n_outputs, values = 1, {**values, "O": 1}
    concrete = model.graph(n_tokens, n_kv, n_outputs)
    assert _nodes(generic.instantiate(values)) == _nodes(concrete)
    assert generic.outputs == concrete.outputs


def test_variants_of_a_model_are_few_and_cut_at_the_order_boundaries():
    vs = variants(512, 4096)
    assert [v.name for v in vs] == ["decode", "decode-split", "small-all", "small-last", "large-all", "large-last"]
    by = {v.name: v for v in vs}
    assert by["decode-split"].n_kv == Dim("KV", 512, 4096)
    assert by["small-all"].n_tokens == Dim("T", 2, 63) and by["small-all"].n_outputs is by["small-all"].n_tokens
    assert by["large-last"].n_tokens == Dim("T", 64, 512) and by["large-last"].n_outputs == Dim("O", 0, 1)
    assert [v.name for v in variants(32, 256)] == ["decode", "small-all", "small-last"]


def test_a_micro_batch_with_some_outputs_has_no_variant():
    with pytest.raises(bankml.BankmlError, match="outputs are all rows or the last"):
        choose_variant(variants(512, 4096), 7, 256, 3)


def test_generic_graph_prints_symbolic_sizes(model):
    v = next(v for v in model.variants if v.name == "large-last")
    text = dump(model.generic_graph(v))
    assert "n_tokens=T" in text and "n_kv=KV" in text
    assert f"[T,{model.hparams.n_embd}]" in text and f"[O,{model.hparams.n_embd}]" in text
    assert "flash_attn_ext_tiled" in text
