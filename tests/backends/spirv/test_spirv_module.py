"""The emitted SPIR-V: valid for Vulkan 1.2 (spirv-val), every float op NoContraction, readable."""
from __future__ import annotations

import re

import pytest

from bankml.backends.spirv import builder as B
from bankml.backends.spirv.q1 import matvec as q1_matvec

MODES = [(rte, dp, v) for v in q1_matvec.VARIANTS for rte in (True, False) for dp in (True, False)]


@pytest.mark.parametrize("rte,denorm,variant", MODES,
                         ids=[f"{v}-rte{int(r)}-denorm{int(d)}" for r, d, v in MODES])
def test_every_q1_matvec_module_passes_spirv_val(rte, denorm, variant):
    B.validate(list(q1_matvec.emit(rte, denorm, variant)))


def test_every_float_add_and_mul_is_no_contraction():
    text = B.disassemble(list(q1_matvec.emit()))
    float_ops = re.findall(r"^\s*(%\S+) = Op(?:FAdd|FSub|FMul) ", text, re.M)
    decorated = set(re.findall(r"OpDecorate (%\S+) NoContraction", text))
    assert len(float_ops) > 30
    assert set(float_ops) <= decorated


def test_q1_matvec_uses_no_fma_instruction_and_no_float64():
    text = B.disassemble(list(q1_matvec.emit()))
    assert "Fma" not in text and "OpExtInst" not in text
    assert "OpTypeFloat 64" not in text and "Float64" not in text


def test_float_controls_follow_the_device():
    text = B.disassemble(list(q1_matvec.emit(True, False)))
    assert "OpExecutionMode %main RoundingModeRTE 32" in text and "DenormPreserve" not in text
    text = B.disassemble(list(q1_matvec.emit(True, True)))
    assert "OpExecutionMode %main DenormPreserve 32" in text


def test_spirv_val_rejects_a_broken_module():
    words = list(q1_matvec.emit())
    words[3] = 3                      # id bound too small
    with pytest.raises(B.BankmlError, match="spirv-val"):
        B.validate(words)


def test_string_words_are_nul_terminated_and_padded():
    assert B.string_words("main") == [0x6E69616D, 0]
    assert B.string_words("abc") == [0x00636261]
