"""The weight-type table (bankml/quants): ggml's sizes and activation types, the mat-mul rule
as it stood before the table, and a complete entry for every type (reference chain, llvm
tiler for every order its rule gives, llvm get_rows element)."""
from __future__ import annotations

import pytest

from bankml.backends.llvm.ggml.matmul.tiling import TILERS, define_mul_mat
from bankml.backends.llvm.ggml.rows import ELEMENTS
from bankml.backends.llvm.registry import KERNELS
from bankml.backends.reference.matmul import CHAINS
from bankml.ir import order as fo
from bankml.ir.ops import Op
from bankml.oracle import ggml as G
from bankml.passes.choose_matmul_kernel import matmul_order
from bankml.quants import (_SIZED_ONLY, ACT_TYPES, F16, GGML_TYPES, Q1_0, Q2_0, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K,
                           Q8_0, Q8_1, Q8_K, WEIGHT_TYPES)

TYPES = sorted(WEIGHT_TYPES)
IDS = [WEIGHT_TYPES[t].name for t in TYPES]
ROWS = (1, 4, 8, 12, 36, 37, 40, 64, 576, 49152, 49153, 49154)
COLS = (0, 1, 2, 3, 7, 8, 9, 63, 64, 512)


def old_matmul_order(wtype: int, n_rows: int, n_cols: int) -> fo.FloatOrder:
    """passes/choose_matmul_kernel.matmul_order before the table (commit 0a6e14f), verbatim."""
    vec_dot = {Q8_0: fo.Q8_0_DOT, Q4_1: fo.Q4_1_DOT, Q1_0: fo.Q1_0_DOT, Q2_0: fo.Q2_0_DOT,
               Q4_0: fo.Q4_0_DOT, Q5_0: fo.Q5_0_DOT, Q5_1: fo.Q5_1_DOT}
    if wtype == F16:
        return fo.F16_TINYBLAS if n_cols >= 2 and n_rows % 4 == 0 else fo.F16_VEC_DOT
    if wtype == Q4_0 and n_rows % 8 == 0:
        return fo.Q4_0_REPACK
    if wtype == Q4_K:
        return fo.Q4_K_REPACK if n_rows % 8 == 0 else fo.Q4_K_MUL_MAT
    if wtype == Q6_K:
        return fo.Q6_K_MUL_MAT
    return vec_dot[wtype]


@pytest.mark.parametrize("wtype", TYPES, ids=IDS)
def test_matmul_order_equals_the_rule_before_the_table(wtype):
    for n_rows in ROWS:
        for n_cols in COLS:
            assert matmul_order(wtype, n_rows, n_cols) is old_matmul_order(wtype, n_rows, n_cols), (n_rows, n_cols)


@pytest.mark.parametrize("wtype", TYPES, ids=IDS)
def test_every_order_of_a_type_is_a_mul_mat_order_with_an_llvm_kernel(wtype):
    orders = {WEIGHT_TYPES[wtype].matmul_order(r, c) for r in ROWS for c in COLS}
    assert WEIGHT_TYPES[wtype].vec_dot in orders
    for order in orders:
        assert order in fo.MUL_MAT_ORDERS                                  # the reference lowers these
        fn = KERNELS.entries.get(("ggml", Op.MUL_MAT, order))
        assert fn is not None, order.kernel
        assert fn is not define_mul_mat or (wtype, order) in TILERS, order.kernel   # the tiled kernel's tiler


@pytest.mark.parametrize("wtype", TYPES, ids=IDS)
def test_every_type_has_a_reference_chain_and_an_llvm_get_rows_element(wtype):
    assert WEIGHT_TYPES[wtype].chain in CHAINS
    assert wtype in ELEMENTS


def test_activation_types_and_their_blocks():
    assert {t: (a.name, a.block, a.block_bytes) for t, a in ACT_TYPES.items()} == {
        F16: ("F16", 1, 2), Q8_0: ("Q8_0", 32, 34), Q8_1: ("Q8_1", 32, 36), Q8_K: ("Q8_K", 256, 292)}
    assert {wt.name: ACT_TYPES[wt.act_type].name for wt in WEIGHT_TYPES.values()} == {
        "F16": "F16", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q1_0": "Q8_0", "Q2_0": "Q8_0", "Q4_0": "Q8_0",
        "Q5_0": "Q8_0", "Q5_1": "Q8_1", "Q4_K": "Q8_K", "Q6_K": "Q8_K"}


def test_one_entry_per_ggml_type():
    assert all(t.ggml_id == i for i, t in GGML_TYPES.items())
    assert all(GGML_TYPES[i] is t for i, t in {**WEIGHT_TYPES, **ACT_TYPES}.items())
    assert not set(GGML_TYPES) & {4, 5, 31, 32, 33, 36, 37, 38}          # removed from ggml
    sized_only = {i for _, i, _, _ in _SIZED_ONLY}
    assert not sized_only & (set(WEIGHT_TYPES) | set(ACT_TYPES))         # a type bankml runs left the list


@pytest.mark.oracle
@pytest.mark.parametrize("ggml_type", sorted(GGML_TYPES), ids=[t.name for _, t in sorted(GGML_TYPES.items())])
def test_block_bytes_equal_ggml_type_traits(ggml_type):
    t, (name, block, size) = GGML_TYPES[ggml_type], G.type_traits(ggml_type)
    assert (t.name.lower(), t.block, t.block_bytes) == (name.lower(), block, size)


@pytest.mark.oracle
@pytest.mark.parametrize("wtype", TYPES, ids=IDS)
def test_act_type_is_ggml_vec_dot_type(wtype):
    assert WEIGHT_TYPES[wtype].act_type == G.vec_dot_type(wtype)
