"""A guarded, memory-mapped GGUF reader (v2 and v3, little-endian).

Mirrors ggml/src/gguf.cpp `gguf_init_from_reader` (header, key/value pairs, tensor infos,
aligned and packed data section) and src/llama-model-loader.cpp's check that each tensor's
bytes lie inside the file. Every count, length, offset and type is checked against the
bytes that remain before it drives an allocation or a loop; a bad file raises one
`CorruptGGUF` line naming the cause. We read GGUF ourselves because PyPI `gguf` does not
know every ggml type this project uses (Q2_0 = 42). Type sizes: bankml/quants (GGML_TYPES).
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bankml.errors import CorruptGGUF
from bankml.quants import GGML_TYPES

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32  # ggml/include/gguf.h
GGML_MAX_DIMS = 4  # ggml/include/ggml.h
GGML_MAX_NAME = 64  # tensor names are shorter than this
INT64_MAX = 2**63 - 1

# GGUF metadata value types: gguf.h `enum gguf_type` -> numpy dtype (None: string / array)
GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9
GGUF_VALUE_DTYPES: dict[int, np.dtype | None] = {
    0: np.dtype("<u1"), 1: np.dtype("<i1"), 2: np.dtype("<u2"), 3: np.dtype("<i2"),
    4: np.dtype("<u4"), 5: np.dtype("<i4"), 6: np.dtype("<f4"), 7: np.dtype("<u1"),
    8: None, 9: None, 10: np.dtype("<u8"), 11: np.dtype("<i8"), 12: np.dtype("<f8"),
}
MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, a one-byte key, value type, the smallest value
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length, name, n_dims, type, offset


def ggml_type_name(type_id: int) -> str:
    """ggml's name for a type id, upper case as in gguf-py (`ggml_type_name`)."""
    return GGML_TYPES[type_id].name if type_id in GGML_TYPES else f"UNKNOWN({type_id})"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ne order (ne0 = row length first), n_dims entries
    offset: int             # absolute offset of the first byte in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)


@dataclass
class GGUFFile:
    """A parsed GGUF header over a read-only memory map of the whole file."""
    path: str
    version: int
    metadata: dict[str, Any]       # strings as str, numeric arrays as numpy, string arrays as lists
    value_types: dict[str, tuple[int, ...]]  # key -> (gguf type,) or (GGUF_ARRAY, element type)
    tensors: dict[str, TensorInfo]  # in file order
    alignment: int
    data_offset: int
    _bytes: np.ndarray = field(repr=False)  # uint8 view of the mapped file

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor_data(self, name: str) -> np.ndarray:
        """The tensor's bytes as a uint8 view of the map (no copy)."""
        t = self.tensors[name]
        return self._bytes[t.offset:t.offset + t.nbytes]


class _Cursor:
    """Reads little-endian fields from a buffer; never reads past its end."""

    def __init__(self, path: str, buf: memoryview):
        self.path, self.buf, self.pos, self.size = path, buf, 0, len(buf)

    def fail(self, what: str) -> CorruptGGUF:
        return CorruptGGUF(f"{self.path}: {what}")

    def remain(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.remain():
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos}, "
                            f"only {self.remain()} remain (truncated file?)")
        view = self.buf[self.pos:self.pos + n]
        self.pos += n
        return view

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack_from(fmt, self.take(struct.calcsize(fmt), what))[0]

    def raw_string(self, what: str) -> memoryview:
        n = self.scalar("<Q", f"{what} length")
        if n > self.remain():
            raise self.fail(f"{what} has length {n}, only {self.remain()} bytes remain")
        return self.take(n, what)

    def string(self, what: str) -> str:
        return str(self.raw_string(what), "utf-8", errors="replace")


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse a GGUF header: `gguf_init_from_reader` plus the loader's file-bounds check."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise CorruptGGUF(f"{path}: file is empty, not a GGUF")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise CorruptGGUF(f"{path}: cannot read: {e.strerror or e}") from None
    data = np.frombuffer(mm, dtype=np.uint8)
    c = _Cursor(path, memoryview(mm))
    version = _read_preamble(c)
    n_tensors = _count(c, "tensor count", MIN_TENSOR_INFO_BYTES)
    n_kv = _count(c, "key/value count", MIN_KV_BYTES)
    metadata, value_types = _read_kvs(c, n_kv)
    alignment = _alignment(c, metadata, value_types)
    infos = _read_tensor_infos(c, n_tensors)
    data_offset = c.pos
    if n_tensors > 0:  # the data section starts at the next multiple of the alignment
        data_offset = -(-c.pos // alignment) * alignment
        if data_offset > size:
            raise c.fail(f"data section at {data_offset} starts past the end of the file ({size} bytes)")
    tensors = _place_tensors(c, infos, data_offset, alignment)
    return GGUFFile(path, version, metadata, value_types, tensors, alignment, data_offset, data)


def _read_preamble(c: _Cursor) -> int:
    """Magic and version, as `gguf_init_from_reader` checks them."""
    magic = bytes(c.take(4, "magic"))
    if magic != GGUF_MAGIC:
        raise c.fail(f"bad magic {magic!r}, expected b'GGUF': not a GGUF file")
    version = c.scalar("<I", "version")
    if version == 0:
        raise c.fail("GGUF version 0 is not a valid version")
    if version & 0xFFFF == 0:
        raise c.fail(f"GGUF version {version:#x} looks byte-swapped: big-endian files are not supported")
    if version == 1:
        raise c.fail("GGUF v1 is not supported (reconvert the model)")
    if version > 3:
        raise c.fail(f"GGUF version {version} is not supported (bankml reads v2 and v3)")
    return version


def _count(c: _Cursor, what: str, min_bytes: int) -> int:
    n = c.scalar("<q", what)
    if n < 0 or n * min_bytes > c.remain():
        raise c.fail(f"{what} {n} is impossible: {c.remain()} bytes remain, each entry needs {min_bytes}")
    return n


def _read_kvs(c: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    metadata: dict[str, Any] = {}
    types: dict[str, tuple[int, ...]] = {}
    for i in range(n_kv):
        key = c.string(f"key {i}")
        if not key:
            raise c.fail(f"key {i} is empty")
        if key in metadata:
            raise c.fail(f"duplicate key {key!r}")
        vtype = c.scalar("<i", f"value type of {key}")
        if vtype == GGUF_ARRAY:
            etype = c.scalar("<i", f"element type of {key}")
            _check_value_type(c, key, etype, in_array=True)
            metadata[key], types[key] = _read_array(c, key, etype), (GGUF_ARRAY, etype)
        else:
            _check_value_type(c, key, vtype, in_array=False)
            metadata[key], types[key] = _read_value(c, key, vtype), (vtype,)
    return metadata, types


def _check_value_type(c: _Cursor, key: str, vtype: int, in_array: bool) -> None:
    if vtype not in GGUF_VALUE_DTYPES or (in_array and vtype == GGUF_ARRAY):
        where = "array element type" if in_array else "value type"
        raise c.fail(f"key {key!r} has unknown {where} {vtype}")


def _read_value(c: _Cursor, key: str, vtype: int) -> Any:
    if vtype == GGUF_STRING:
        return c.string(f"value of {key}")
    dtype = GGUF_VALUE_DTYPES[vtype]
    value = np.frombuffer(c.take(dtype.itemsize, f"value of {key}"), dtype=dtype)[0]
    return bool(value) if vtype == GGUF_BOOL else value.item()


def _read_array(c: _Cursor, key: str, etype: int) -> Any:
    n = c.scalar("<Q", f"array length of {key}")
    dtype = GGUF_VALUE_DTYPES[etype]
    item = 8 if dtype is None else dtype.itemsize  # a string needs at least its length
    if n * item > c.remain():
        raise c.fail(f"key {key!r} array of {n} elements needs at least {n * item} bytes, "
                     f"only {c.remain()} remain")
    if dtype is not None:
        values = np.frombuffer(c.take(n * item, f"array {key}"), dtype=dtype)
        return values != 0 if etype == GGUF_BOOL else values.copy()
    return _read_strings(c, key, n)


def _read_strings(c: _Cursor, key: str, n: int) -> list[str]:
    """n strings in one tight loop (tokenizer lists hold ~150k of them)."""
    buf, pos, size = c.buf, c.pos, c.size
    unpack = struct.Struct("<Q").unpack_from
    out: list[str] = []
    append = out.append
    for i in range(n):
        if pos + 8 > size:
            c.pos = pos
            raise c.fail(f"key {key!r} string {i} of {n}: length passes the end of the file")
        length = unpack(buf, pos)[0]
        pos += 8
        if length > size - pos:
            c.pos = pos
            raise c.fail(f"key {key!r} string {i} of {n}: length {length} passes the end of the file")
        append(str(buf[pos:pos + length], "utf-8", errors="replace"))
        pos += length
    c.pos = pos
    return out


def _alignment(c: _Cursor, metadata: dict[str, Any], types: dict[str, tuple[int, ...]]) -> int:
    """general.alignment: a u32 power of two, default 32 (`gguf_init_from_reader`)."""
    if "general.alignment" not in metadata:
        return GGUF_DEFAULT_ALIGNMENT
    if types["general.alignment"] != (GGUF_UINT32,):
        raise c.fail(f"key 'general.alignment' must be u32, is gguf type {types['general.alignment'][0]}")
    a = metadata["general.alignment"]
    if a == 0 or a & (a - 1):
        raise c.fail(f"general.alignment {a} is not a power of 2")
    return a


def _read_tensor_infos(c: _Cursor, n_tensors: int) -> list[tuple[str, int, tuple[int, ...], int, int]]:
    infos, seen = [], set()
    for i in range(n_tensors):
        info = _read_tensor_info(c, i)
        if info[0] in seen:
            raise c.fail(f"duplicate tensor name {info[0]!r}")
        seen.add(info[0])
        infos.append(info)
    return infos


def _read_tensor_info(c: _Cursor, i: int) -> tuple[str, int, tuple[int, ...], int, int]:
    """(name, type, shape, relative offset, nbytes): one entry of the tensor info table."""
    raw = c.raw_string(f"tensor {i} name")
    name = str(raw, "utf-8", errors="replace")
    if len(raw) >= GGML_MAX_NAME:
        raise c.fail(f"tensor {i} name {name[:40]!r}... is {len(raw)} bytes, ggml allows {GGML_MAX_NAME - 1}")
    n_dims = c.scalar("<I", f"tensor {name} n_dims")
    if n_dims > GGML_MAX_DIMS:
        raise c.fail(f"tensor {name} has {n_dims} dimensions, ggml allows at most {GGML_MAX_DIMS}")
    shape = tuple(c.scalar("<q", f"tensor {name} dim {j}") for j in range(n_dims))
    nelements = 1
    for j, ne in enumerate(shape):
        if ne < 0:
            raise c.fail(f"tensor {name} dim {j} is {ne} < 0")
        nelements *= ne
    if nelements > INT64_MAX:
        raise c.fail(f"tensor {name} shape {list(shape)} has more than 2^63 elements")
    ggml_type = c.scalar("<i", f"tensor {name} type")
    if ggml_type not in GGML_TYPES:
        raise c.fail(f"tensor {name} has unknown ggml type {ggml_type}")
    t = GGML_TYPES[ggml_type]
    row = shape[0] if shape else 1
    if row % t.block:
        raise c.fail(f"tensor {name} row length {row} is not a multiple of the {t.name} block size {t.block}")
    offset = c.scalar("<Q", f"tensor {name} offset")
    return name, ggml_type, shape, offset, nelements // t.block * t.block_bytes


def _place_tensors(c: _Cursor, infos: list[tuple[str, int, tuple[int, ...], int, int]],
                   data_offset: int, alignment: int) -> dict[str, TensorInfo]:
    """Offsets aligned, packed in order (gguf.cpp) and inside the file (llama-model-loader)."""
    tensors: dict[str, TensorInfo] = {}
    expected = 0
    for name, ggml_type, shape, rel, nbytes in infos:
        if rel % alignment:
            raise c.fail(f"tensor {name} offset {rel} is not a multiple of the alignment {alignment}")
        start, end = data_offset + rel, data_offset + rel + nbytes
        if end > c.size:
            raise c.fail(f"tensor {name} bytes [{start}, {end}) pass the end of the file ({c.size} bytes)")
        if rel != expected:
            raise c.fail(f"tensor {name} offset {rel}, expected {expected}: ggml needs tensors packed in order")
        expected += -(-nbytes // alignment) * alignment
        tensors[name] = TensorInfo(name, ggml_type, shape, start, nbytes)
    return tensors
