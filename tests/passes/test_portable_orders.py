"""The portable profile as IR data: the same graph as ggml's with the portable orders."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import bankml
from bankml.cli import main
from bankml.errors import BankmlError
from bankml.ir.ops import Op
from bankml.profiles.portable import orders as po
from bankml.testing import models


@pytest.fixture(scope="module", params=["qwen3-small-q1_0", "smollm2-q4_1"])
def pair(request):
    path = models.path(request.param)
    with bankml.load(path, backend="reference") as g, bankml.load(path, backend="reference", profile="portable") as p:
        yield g, p


@pytest.mark.parametrize("sizes", [(1, 256, 1), (7, 256, 7), (70, 512, 1)])
def test_every_order_is_portable_and_the_named_tensors_are_ggmls(pair, sizes):
    ggml, portable = pair[0].graph(*sizes), pair[1].graph(*sizes)
    assert portable.meta["profile"] == "portable" and "profile" not in ggml.meta
    orders = {n.order for n in portable if n.order is not None}
    assert orders and all(o.kernel.startswith("portable.") for o in orders)
    assert all(n.order is not None for n in portable if n.op in (Op.MUL_MAT, Op.RMS_NORM, Op.FLASH_ATTN, Op.ROPE))
    names = lambda g: sorted(n.name for n in g if n.name and n.op is not Op.QUANTIZE)  # noqa: E731
    assert names(ggml) == names(portable)


def test_one_quantization_per_activation_whatever_the_weight_types(pair):
    g = pair[1].graph(5, 256, 5)
    q = [n for n in g if n.op is Op.QUANTIZE]
    assert all(n.params["type"] == po.ACT_TYPE and n.order == po.QUANTIZE for n in q)
    assert len({n.inputs[0] for n in q}) == len(q) == 4 * pair[1].hparams.n_layer + 1


def test_the_cache_is_int8_rows():
    with bankml.load(models.path("qwen3-small-q1_0"), backend="reference", profile="portable") as m:
        assert all(n.dtype == po.CACHE_TYPE for n in m.graph(1, 256, 1) if n.op in (Op.CACHE, Op.SET_ROWS))
        caches = m.session().caches
        assert caches[(0, "k")].dtype.names == ("d", "qs") and caches[(0, "k")].shape == (m.kv_size, 2)


def test_ir_shows_the_portable_orders():
    r = CliRunner().invoke(main, ["ir", str(models.path("qwen3-small-q1_0")), "--profile", "portable",
                                  "--variant", "decode"])
    assert r.exit_code == 0, r.output
    assert "profile=portable" in r.output
    for kernel in ("portable.group_dot fold=exact256", "portable.attention_i8", "portable.rmsnorm",
                   "portable.rope_table", "portable.quantize_act", "portable.swiglu"):
        assert kernel in r.output
    assert "ggml_vec_dot" not in r.output


def test_unknown_profile_or_an_unlowered_backend_is_one_clear_error():
    with pytest.raises(BankmlError, match="unknown profile"):
        bankml.load(models.path("qwen3-small-q1_0"), profile="fast")
    r = CliRunner().invoke(main, ["run", str(models.path("qwen3-small-q1_0")), "--profile", "portable", "-p", "x",
                                  "--raw", "-n", "1", "--backend", "llvm", "--gpu", "0"])
    assert r.exit_code == 1 and "no GPU lowering" in r.output
