"""The DSL's doors: tensors as attributes checked against the file, inputs asked for, facts on the Architecture."""
from __future__ import annotations

import pytest
from gguf_fixtures import write_model

import bankml
from bankml.arch import Builder, MissingTensor, architecture, registry
from bankml.arch.blocks import Batch
from bankml.errors import ModelRefused
from bankml.ir.ops import Op


def _builder(m) -> Builder:
    """A Builder of a 3-token micro-batch for a loaded model, before its architecture builds anything."""
    return Builder(m.plan, Batch(3, 256, 3, m.kv_size), m.shapes, m.kv, m.architecture)


@pytest.fixture
def asks_for(tmp_path):
    """A builder alone, registered for one test, that reads `part` of layer 0 from a llama file."""
    def load(part: str):
        @architecture("asks_for")
        def build(b) -> None:
            getattr(b.model.layers[0], part)
        return bankml.load(write_model(tmp_path / "m.gguf", n_layer=2, tied=True), arch="asks_for",
                           backend="reference", threads=1)
    yield load
    registry.ARCHITECTURES.pop("asks_for", None)


def test_a_graph_asking_for_a_tensor_the_file_lacks_gets_one_line_naming_it(asks_for):
    m = asks_for("attn_q_norm")
    with pytest.raises(ModelRefused) as err:
        m.build_graph(3, 256, 3)
    msg = str(err.value)
    assert isinstance(err.value, MissingTensor) and "\n" not in msg
    assert msg.startswith("model.layers[0].attn_q_norm: tensor blk.0.attn_q_norm.weight is not in the file")
    assert "the asks_for graph asks for it" in msg


def test_getattr_with_a_default_asks_whether_the_file_has_a_tensor(asks_for):
    b = _builder(asks_for("attn_q"))
    assert getattr(b.model.layers[0], "attn_q_norm", None) is None
    assert b.model.layers[1].attn_q.name == "blk.1.attn_q.weight"


def test_output_is_token_embd_in_a_tied_file_and_output_when_untied(tmp_path):
    tied = _builder(bankml.load(write_model(tmp_path / "t.gguf", tied=True), backend="reference", threads=1))
    untied = _builder(bankml.load(write_model(tmp_path / "u.gguf"), backend="reference", threads=1))
    assert tied.model.output.name == "token_embd.weight" == tied.model.tok_embd.name
    assert untied.model.output.name == "output.weight"


def test_inputs_are_made_when_asked_and_once(tmp_path):
    b = _builder(bankml.load(write_model(tmp_path / "m.gguf"), backend="reference", threads=1))
    assert [n.name for n in b.g.nodes.values()] == ["inp_tokens"]
    pos = b.inp_pos()
    attn = b.inp_attn()
    assert b.inp_pos() is pos and attn.k_idxs is pos and attn.kq_mask_swa is None
    assert [(n.op, n.name) for n in b.g.nodes.values()] == [
        (Op.INPUT, "inp_tokens"), (Op.INPUT, "inp_pos"), (Op.INPUT, "attn_inp_kq_mask")]


def test_architecture_facts_are_fields_of_the_registered_architecture():
    llama, qwen3, gemma3 = (registry.lookup(n) for n in ("llama", "qwen3", "gemma3"))
    assert (llama.ggml_layout, qwen3.ggml_layout, gemma3.ggml_layout) == ((5, 3), (7, 5), None)
    assert llama.portable is True and qwen3.portable is True and not gemma3.portable
    assert registry.lookup("qwen35").portable is True
    assert registry.portable() == ["llama", "qwen3", "qwen35"]


def test_portable_profile_refuses_an_architecture_not_registered_portable(tmp_path):
    path = write_model(tmp_path / "g.gguf", arch="gemma3", tied=True)
    with pytest.raises(bankml.BankmlError, match="profile 'portable' runs llama, qwen3 and qwen35 graphs .*not gemma3"):
        bankml.load(path, backend="reference", threads=1, profile="portable")
    bankml.load(write_model(tmp_path / "q.gguf", arch="qwen3", tied=True), backend="reference", threads=1,
                profile="portable").close()
