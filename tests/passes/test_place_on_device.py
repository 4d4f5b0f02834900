"""place_on_device marks decode's Q1_0 matvecs for the model's device, and nothing else."""
from __future__ import annotations

import bankml
from bankml.ir.ops import Op
from bankml.ir.order import Q1_0_DOT
from bankml.passes.pipeline import run_passes
from bankml.testing import models


def _placed(m, n_tokens: int, n_kv: int, n_outputs: int, device: str | None = "gpu") -> list:
    g = m.build_graph(n_tokens, n_kv, n_outputs)
    if device:
        g.meta["device"] = device
    g = run_passes(g)
    return [n for n in g if n.op is Op.MUL_MAT and "device" in n.params]


def test_a_decode_step_places_every_q1_0_matvec_on_the_device():
    with bankml.load(models.path("qwen3-small-q1_0"), backend="reference") as m:
        placed = _placed(m, 1, 256, 1)
        assert len(placed) == 4 * 7 + 1             # q k v o gate up down per layer, and the lm_head
        assert all(n.order is Q1_0_DOT and n.params["device"] == "gpu" for n in placed)


def test_without_a_device_or_with_more_than_one_row_nothing_is_placed():
    with bankml.load(models.path("qwen3-small-q1_0"), backend="reference") as m:
        assert _placed(m, 1, 256, 1, device=None) == []
        assert _placed(m, 7, 256, 7) == []
        assert m.device is None and "device" not in m.graph(1, 256, 1).meta


def test_a_model_without_q1_0_weights_places_nothing():
    with bankml.load(models.path("smollm2-q4_1"), backend="reference") as m:
        assert _placed(m, 1, 256, 1) == []
