"""Compiled code kept between processes, so a model's second run starts without compiling.

    key = compile_cache.key(ir_text, "haswell", features, ...)   # sha256 hex of every part
    obj = compile_cache.get(key)                                  # bytes, or None: missing, disabled, corrupt
    compile_cache.put(key, obj)                                   # atomic: a tmp file, then rename

Entries live in <cache>/jit/<key>.o, <cache> being $BANKML_CACHE or ~/.cache/bankml;
BANKML_JIT_CACHE=0 turns the cache off. An entry is a magic line, the sha256 of the object and
the object: one that fails the check (a torn write, a flipped bit) is ignored and rewritten by
the next compile, never handed to the JIT (LLVM aborts the process on a bad object file).
The cache never makes a compile fail: an unwritable folder only costs the saving.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

MAGIC = b"bankml-jit-object 1\n"
ELF = b"\x7fELF"


def cache_root() -> Path:
    """~/.cache/bankml, or $BANKML_CACHE (as bankml.oracle.paths.cache_root)."""
    return Path(os.environ.get("BANKML_CACHE", Path.home() / ".cache" / "bankml"))


def jit_dir() -> Path:
    return cache_root() / "jit"


def enabled() -> bool:
    return os.environ.get("BANKML_JIT_CACHE", "1").strip().lower() not in ("0", "off", "false", "no")


def key(*parts: str) -> str:
    """sha256 over the parts, each length-prefixed so that no two part lists collide."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def entry_path(k: str) -> Path:
    return jit_dir() / f"{k}.o"


def get(k: str) -> bytes | None:
    """The object file saved under k, or None (no entry, cache off, or an entry that fails its check)."""
    if not enabled():
        return None
    try:
        data = entry_path(k).read_bytes()
    except OSError:
        return None
    head = len(MAGIC) + 32
    obj = data[head:]
    if data[:len(MAGIC)] != MAGIC or hashlib.sha256(obj).digest() != data[len(MAGIC):head] or not obj.startswith(ELF):
        _log(f"jit cache: {entry_path(k)} is corrupt; compiling again")
        return None
    return obj


def put(k: str, obj: bytes) -> None:
    """Save an object file under k: written to a tmp file in the same folder, then renamed over."""
    if not enabled() or not obj.startswith(ELF):
        return
    d = jit_dir()
    tmp = None
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{k[:16]}.", suffix=".tmp", dir=d)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(obj).digest() + obj)
        os.replace(tmp, entry_path(k))
        tmp = None
    except OSError as e:
        _log(f"jit cache: cannot save to {d}: {e}")
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def compiled_dir(model_path: str | os.PathLike, version: str) -> Path:
    """Where `bankml compile` writes a model's plan and IR: <cache>/compiled/<sha256[:16]>-<version>/."""
    h = hashlib.sha256()
    with open(model_path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return cache_root() / "compiled" / f"{h.hexdigest()[:16]}-{version}"


def _log(msg: str) -> None:
    if os.environ.get("BANKML_DEBUG", "0") not in ("", "0"):
        print(msg, file=sys.stderr)
