"""read_gguf: agrees with gguf-py on good files, refuses every hostile one with one CorruptGGUF line."""
from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_fixtures import (ARRAY, F16_T, F32, F32_T, Q1_0_T, Q2_0_T, Q8_0_T, STR, U32, gguf_bytes, kv, s,
                           real_models, tensor_info, write)

from bankml.errors import CorruptGGUF
from bankml.gguf import ggml_type_name, read_gguf
from bankml.oracle.paths import cache_root


def writer_file(path: Path) -> Path:
    """A small file from gguf-py's GGUFWriter with every value type and three tensor types."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200), w.add_int8("t.i8", -5), w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -3000), w.add_uint32("t.u32", 4000000000), w.add_int32("t.i32", -7)
    w.add_float32("t.f32", 0.1), w.add_uint64("t.u64", 2**60), w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 0.1), w.add_bool("t.bool", True), w.add_string("t.str", "héllo")
    w.add_array("t.ints", [1, 2, 3]), w.add_array("t.floats", [0.5, 1.5])
    w.add_array("t.bools", [True, False]), w.add_token_list(["a", "bé", ""])
    rng = np.random.default_rng(0)
    w.add_tensor("a", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("b", rng.standard_normal((2, 32)).astype(np.float16))
    w.add_tensor("q", rng.integers(0, 255, (2, 34), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def same_as_gguf_py(path: Path) -> None:
    """Tensors (names, types, shapes, offsets, bytes) and metadata equal GGUFReader's."""
    ours, ref = read_gguf(path), gguf.GGUFReader(path)
    assert list(ours.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert (mine.ggml_type, mine.shape, mine.offset, mine.nbytes) == (
            int(t.tensor_type), tuple(int(d) for d in t.shape), int(t.data_offset), int(t.n_bytes))
        assert mine.type_name == t.tensor_type.name
    assert ours.alignment == ref.alignment
    assert ours.data_offset == ref.data_offset
    fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    for key, f in fields.items():
        got, want = ours.metadata[key], f.contents()
        if isinstance(got, np.ndarray):
            assert got.tolist() == list(want), key
        else:
            assert got == want, key


def test_reads_gguf_writer_file_like_gguf_py(tmp_path):
    same_as_gguf_py(writer_file(tmp_path / "w.gguf"))


def test_metadata_values_decoded(tmp_path):
    g = read_gguf(writer_file(tmp_path / "w.gguf"))
    assert g.version == 3
    assert g.get("t.str") == "héllo" and g.get("t.u64") == 2**60 and g.get("t.bool") is True
    assert g.get("t.f32") == float(np.float32(0.1)) and g.get("t.f64") == 0.1
    assert g.get("tokenizer.ggml.tokens") == ["a", "bé", ""]
    assert g.get("t.bools").tolist() == [True, False] and g.get("t.ints").dtype == np.int32
    assert g.get("missing", 7) == 7


def test_tensor_data_is_a_view_of_the_map(tmp_path):
    path = writer_file(tmp_path / "w.gguf")
    g, ref = read_gguf(path), gguf.GGUFReader(path)
    for t in ref.tensors:
        data = g.tensor_data(t.name)
        assert data.dtype == np.uint8 and not data.flags.writeable and not data.flags.owndata
        assert data.tobytes() == np.asarray(t.data).tobytes()


def test_reads_version_2(tmp_path):
    g = read_gguf(write(tmp_path / "v2.gguf", gguf_bytes({"a": (U32, 1)}, [("x", (4,), F32_T)], version=2)))
    assert g.version == 2 and g.tensors["x"].nbytes == 16


def test_q1_0_and_q2_0_sizes_from_ggml_type_traits(tmp_path):
    path = write(tmp_path / "q.gguf", gguf_bytes({}, [("a", (128, 3), Q1_0_T), ("b", (64, 2), Q2_0_T)]))
    g = read_gguf(path)
    assert (g.tensors["a"].nbytes, g.tensors["b"].nbytes) == (3 * 18, 2 * 18)
    assert (g.tensors["a"].type_name, g.tensors["b"].type_name) == ("Q1_0", "Q2_0")


def test_ggml_type_name():
    assert [ggml_type_name(t) for t in (0, 1, 8, 41, 42)] == ["F32", "F16", "Q8_0", "Q1_0", "Q2_0"]
    assert ggml_type_name(4) == "UNKNOWN(4)"


def test_alignment_from_general_alignment(tmp_path):
    data = gguf_bytes({"general.alignment": (U32, 64)}, [("a", (4,), F32_T), ("b", (4,), F32_T)], alignment=64)
    g = read_gguf(write(tmp_path / "a.gguf", data))
    assert g.alignment == 64 and g.data_offset % 64 == 0 and g.tensors["b"].offset == g.data_offset + 64


def test_token_list_of_150k_strings_loads(tmp_path):
    tokens = [f"tok{i}" for i in range(150_000)]
    path = write(tmp_path / "tok.gguf", gguf_bytes({"tokenizer.ggml.tokens": (ARRAY, (STR, tokens))}, []))
    g = read_gguf(path)
    assert g.metadata["tokenizer.ggml.tokens"] == tokens


def test_every_prefix_of_a_valid_file_is_corrupt(tmp_path):
    full = writer_file(tmp_path / "w.gguf").read_bytes()
    last = read_gguf(tmp_path / "w.gguf").tensors["q"]
    cut = tmp_path / "cut.gguf"
    for n in range(last.offset + last.nbytes):
        cut.write_bytes(full[:n])
        with pytest.raises(CorruptGGUF):
            read_gguf(cut)
    cut.write_bytes(full[:last.offset + last.nbytes])  # the padding after the last tensor is optional
    assert read_gguf(cut).tensors["q"].nbytes == 68


HEAD = b"GGUF" + struct.pack("<I", 3)


def counts(n_tensors: int, n_kv: int) -> bytes:
    return HEAD + struct.pack("<qq", n_tensors, n_kv)


def one_tensor(ne: tuple[int, ...], ggml_type: int = F32_T, offset: int = 0, name: str = "x",
               data: int = 64, kvs: bytes = b"", n_kv: int = 0) -> bytes:
    head = counts(1, n_kv) + kvs + tensor_info(name, ne, ggml_type, offset)
    return head + b"\0" * (-len(head) % 32) + b"\0" * data


HOSTILE = {
    "empty": (b"", "empty"),
    "bad_magic": (b"GGML" + gguf_bytes({}, [])[4:], "bad magic"),
    "version_0": (b"GGUF" + struct.pack("<Iqq", 0, 0, 0), "version 0"),
    "version_1": (b"GGUF" + struct.pack("<Iqq", 1, 0, 0), "v1"),
    "version_99": (b"GGUF" + struct.pack("<Iqq", 99, 0, 0), "version 99"),
    "big_endian": (b"GGUF" + struct.pack(">Iqq", 3, 0, 0), "big-endian"),
    "truncated_counts": (HEAD + b"\1\0", "tensor count"),
    "huge_tensor_count": (counts(2**40, 0), "tensor count 1099511627776"),
    "negative_tensor_count": (counts(-1, 0), "tensor count -1"),
    "huge_kv_count": (counts(0, 2**40), "key/value count 1099511627776"),
    "huge_key_length": (counts(0, 1) + struct.pack("<Q", 2**60) + b"\0" * 64, "key 0 has length 1152921504606846976"),
    "empty_key": (counts(0, 1) + kv("", U32, 1), "key 0 is empty"),
    "duplicate_key": (counts(0, 2) + kv("a", U32, 1) + kv("a", U32, 2), "duplicate key 'a'"),
    "huge_string_value": (counts(0, 1) + s("k") + struct.pack("<iQ", STR, 2**60), "value of k has length 1152921504606846976"),
    "unknown_value_type": (counts(0, 1) + s("k") + struct.pack("<i", 13) + b"\0" * 8, "unknown value type 13"),
    "negative_value_type": (counts(0, 1) + s("k") + struct.pack("<i", -1) + b"\0" * 8, "unknown value type -1"),
    "unknown_array_type": (counts(0, 1) + s("k") + struct.pack("<iiQ", ARRAY, 13, 1), "unknown array element type 13"),
    "nested_array": (counts(0, 1) + s("k") + struct.pack("<iiQ", ARRAY, ARRAY, 1), "unknown array element type 9"),
    "huge_array": (counts(0, 1) + s("k") + struct.pack("<iiQ", ARRAY, U32, 2**50), "array of 1125899906842624"),
    "huge_string_array": (counts(0, 1) + s("k") + struct.pack("<iiQ", ARRAY, STR, 2**50), "array of 1125899906842624"),
    "huge_string_in_array": (counts(0, 1) + s("k") + struct.pack("<iiQQ", ARRAY, STR, 2, 2**60) + b"\0" * 16,
                             "string 0 of 2"),
    "alignment_not_power_of_2": (counts(0, 1) + kv("general.alignment", U32, 48), "not a power of 2"),
    "alignment_zero": (counts(0, 1) + kv("general.alignment", U32, 0), "not a power of 2"),
    "alignment_wrong_type": (counts(0, 1) + kv("general.alignment", F32, 32.0), "must be u32"),
    "huge_tensor_name": (counts(1, 0) + struct.pack("<Q", 2**60) + b"\0" * 64, "tensor 0 name has length 1152921504606846976"),
    "long_tensor_name": (one_tensor((4,), name="n" * 64), "ggml allows 63"),
    "n_dims_5": (one_tensor((1, 1, 1, 1, 4)), "5 dimensions"),
    "negative_dim": (one_tensor((4, -1)), "dim 1 is -1"),
    "too_many_elements": (one_tensor((2**62, 2**62, 4)), "more than 2^63"),
    "unknown_ggml_type": (one_tensor((4,), ggml_type=99), "unknown ggml type 99"),
    "removed_ggml_type_4": (one_tensor((32,), ggml_type=4), "unknown ggml type 4"),
    "negative_ggml_type": (one_tensor((4,), ggml_type=-1), "unknown ggml type -1"),
    "row_not_multiple_of_block": (one_tensor((48,), ggml_type=Q8_0_T), "not a multiple of the Q8_0 block size 32"),
    "offset_past_the_end": (one_tensor((4,), offset=2**40), "pass the end of the file"),
    "offset_overflow": (one_tensor((4,), offset=2**64 - 32), "pass the end of the file"),
    "misaligned_offset": (one_tensor((4,), offset=4), "offset 4 is not a multiple of the alignment 32"),
    "data_past_the_end": (one_tensor((64,), data=100), "pass the end of the file"),
    "huge_tensor_past_the_end": (one_tensor((2**40, 2**20), ggml_type=F16_T), "pass the end of the file"),
    "tensor_not_packed": (gguf_bytes({}, [("a", (4,), F32_T), ("b", (4,), F32_T)]).replace(
        tensor_info("b", (4,), F32_T, 32), tensor_info("b", (4,), F32_T, 0)), "offset 0, expected 32"),
    "duplicate_tensor_name": (gguf_bytes({}, [("a", (4,), F32_T), ("b", (4,), F32_T)]).replace(
        s("b"), s("a")), "duplicate tensor name 'a'"),
    "data_section_past_the_end": (counts(1, 0) + tensor_info("x", (0,), F32_T, 0), "data section"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_refuses_hostile_file(tmp_path, case):
    data, cause = HOSTILE[case]
    path = write(tmp_path / f"{case}.gguf", data)
    tracemalloc.start()
    with pytest.raises(CorruptGGUF) as err:
        read_gguf(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated before refusing"   # huge counts are refused, not allocated
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    assert cause in msg


def test_refuses_missing_file(tmp_path):
    with pytest.raises(CorruptGGUF, match="cannot read"):
        read_gguf(tmp_path / "absent.gguf")


def test_zero_element_tensor_is_allowed_as_in_ggml(tmp_path):
    g = read_gguf(write(tmp_path / "z.gguf", gguf_bytes({}, [("z", (0, 4), F32_T), ("a", (4,), F32_T)])))
    assert g.tensors["z"].nbytes == 0 and g.tensor_data("z").size == 0


def gguf_py_readable(paths):
    """gguf-py cannot read Q2_0 (type 42): those files are checked by the oracle tests instead."""
    return [p for p in paths if not any(t.ggml_type == Q2_0_T for t in read_gguf(p).tensors.values())]


@pytest.mark.parametrize("path", gguf_py_readable(real_models()) or [None], ids=lambda p: p.name if p else "absent")
def test_real_model_reads_like_gguf_py(path):
    if path is None:
        pytest.skip(f"no GGUF in {cache_root() / 'models'} nor $BANKML_TEST_GGUF")
    same_as_gguf_py(path)
