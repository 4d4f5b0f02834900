"""bankml diff: run tokens through bankml and llama.cpp and find the first named tensor that differs.

Names are the debugging contract: bankml names its nodes as llama.cpp's cb() names its
tensors, so the k-th tensor called "Qcur-0" in micro-batch u is compared with llama.cpp's
k-th "Qcur-0" of micro-batch u, by the bytes of its f32 values.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bankml import oracle


@dataclass
class Compared:
    ubatch: int
    name: str
    occurrence: int
    op: str
    identical: bool
    shape: tuple[int, ...]


@dataclass
class DiffResult:
    compared: list[Compared] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)      # bankml names llama.cpp did not report

    @property
    def first_difference(self) -> Compared | None:
        return next((c for c in self.compared if not c.identical), None)

    def summary(self) -> str:
        d = self.first_difference
        if d is None:
            return f"identical ({len(self.compared)} named tensors compared)"
        return (f"first difference: {d.name} (micro-batch {d.ubatch}, occurrence {d.occurrence}, op {d.op}, "
                f"shape {list(d.shape)}) after {self.compared.index(d)} identical tensors")


def _comparable(name: str) -> bool:
    return "(view)" not in name and "(permuted)" not in name and not name.startswith("inp_")


def diff(model, tokens, outputs: str = "all", decode_from: int | None = None, names=None,
         llama_threads: int = 2, backend: str = "llvm", cache_type: str = "f16",
         cache_type_k: str | None = None, cache_type_v: str | None = None) -> DiffResult:
    """Compare every named tensor (or those in `names`) of a prefill (+ decodes) with llama.cpp,
    both with the same K/V cache types."""
    from bankml.runtime.model import Model
    from bankml.runtime.options import ModelOptions
    m = model if isinstance(model, Model) else Model(model, ModelOptions(
        backend=backend, threads=llama_threads, llama_threads=llama_threads, cache_type=cache_type,
        cache_type_k=cache_type_k, cache_type_v=cache_type_v))
    tokens = list(tokens)
    decode_from = decode_from or len(tokens)
    ours: list[tuple[int, str, str, np.ndarray]] = []
    sess = m.session()

    def keep(ub, node, value):
        if _comparable(node.name) and (names is None or node.name in names):
            ours.append((ub, node.name, node.op.value, np.asarray(value)))
    sess.trace = keep
    sess.prefill(tokens[:decode_from], outputs=outputs)
    for t in tokens[decode_from:]:
        sess.decode(t)

    theirs = oracle.tensors(m.path, tokens, names=names, threads=m.llama_threads, n_ubatch=m.n_ubatch,
                            outputs=outputs, decode_from=decode_from, n_ctx=m.n_ctx,
                            cache_type_k=m.cache_type_k, cache_type_v=m.cache_type_v)
    result = DiffResult()
    seen: dict[tuple[int, str], int] = {}
    for ub, name, op, value in ours:
        k = seen.get((ub, name), 0)
        seen[(ub, name)] = k + 1
        cands = [t for t in theirs.get(name, []) if t.ubatch == ub]
        if k >= len(cands):
            result.missing.append(f"{name}#{k}@{ub}")
            continue
        a = np.ascontiguousarray(value, np.float32).ravel()
        b = np.ascontiguousarray(cands[k].f32()).ravel()
        same = a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))
        result.compared.append(Compared(ub, name, k, op, same, value.shape))
    return result
