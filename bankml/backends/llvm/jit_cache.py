"""Compiled code kept between processes, so a model's second run starts without compiling.

    key = jit_cache.key(ir_text, "haswell", features, ...)   # sha256 hex of every part
    obj = jit_cache.get(key)                                  # bytes, or None: missing, disabled, corrupt
    jit_cache.put(key, obj)                                   # atomic: a tmp file, then rename
    jit_cache.entries()                                       # [Entry(path, size, last_used)], oldest first
    jit_cache.clear()                                         # removes entries and stale tmp files: how many

Entries live in <cache>/jit/<key>.o, <cache> being $BANKML_CACHE or ~/.cache/bankml;
BANKML_JIT_CACHE=0 turns the cache off. An entry is a magic line, the sha256 of the object and
the object: one that fails the check (a torn write, a flipped bit) is ignored and rewritten by
the next compile, never handed to the JIT (LLVM aborts the process on a bad object file).
The cache never makes a compile fail: an unwritable folder only costs the saving.

The folder is capped at BANKML_JIT_CACHE_MB (default 512): get() marks an entry used (its
mtime), and put() then removes the least recently used entries until the rest fit, never the
one it just wrote.

`counts` is this process's tally: gets that found a good entry ("hit"), gets that did not
("miss": that code is compiled) and objects saved ("put"); bench/run.py reads it to tell a
warm cache from a cold one, which the folder cannot when other processes share it.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"bankml-jit-object 1\n"
ELF = b"\x7fELF"
DEFAULT_CAP_MB = 512
STALE_TMP_S = 60            # a tmp file older than this is a dead writer's, not a live one's
counts = {"hit": 0, "miss": 0, "put": 0}


@dataclass(frozen=True)
class Entry:
    path: Path
    size: int               # bytes on disk
    last_used: float        # seconds since the epoch: when it was written or last read by get()


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


def get(k: str, count_miss: bool = True) -> bytes | None:
    """The object file saved under k, or None (no entry, cache off, or an entry that fails its check).
    count_miss: False where a miss is looked up again under another key (counts: compiles)."""
    if not enabled():
        return None
    try:
        data = entry_path(k).read_bytes()
    except OSError:
        counts["miss"] += count_miss
        return None
    head = len(MAGIC) + 32
    obj = data[head:]
    if data[:len(MAGIC)] != MAGIC or hashlib.sha256(obj).digest() != data[len(MAGIC):head] or not obj.startswith(ELF):
        _log(f"jit cache: {entry_path(k)} is corrupt; compiling again")
        counts["miss"] += count_miss
        return None
    counts["hit"] += 1
    try:
        os.utime(entry_path(k))         # used now: the last to be evicted
    except OSError:
        pass
    return obj


def put(k: str, obj: bytes) -> None:
    """Save an object file under k (a tmp file in the same folder, then renamed over it), then
    evict the least recently used entries beyond the cap."""
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
        counts["put"] += 1
        _evict(keep=entry_path(k), added=len(MAGIC) + 32 + len(obj))
    except OSError as e:
        _log(f"jit cache: cannot save to {d}: {e}")
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def cap_bytes() -> int:
    """BANKML_JIT_CACHE_MB (may be fractional), default 512 MB; a bad value means the default."""
    raw = os.environ.get("BANKML_JIT_CACHE_MB", "")
    try:
        mb = float(raw) if raw.strip() else DEFAULT_CAP_MB
    except ValueError:
        _log(f"jit cache: BANKML_JIT_CACHE_MB={raw!r} is not a number; using {DEFAULT_CAP_MB}")
        mb = DEFAULT_CAP_MB
    return max(0, int(mb * 1024 * 1024))


def entries() -> list[Entry]:
    """Every <key>.o in the folder (checked or not), least recently used first."""
    out = []
    for p in jit_dir().glob("*.o"):
        try:
            st = p.stat()
        except OSError:             # removed meanwhile by another process
            continue
        out.append(Entry(p, st.st_size, st.st_mtime))
    return sorted(out, key=lambda e: (e.last_used, e.path.name))


# jit folder -> its bytes when this process last listed it, plus the bytes it wrote there since
_listed_bytes: dict[Path, int] = {}


def _evict(keep: Path, added: int) -> None:
    """Remove least recently used entries, never `keep`, until the folder fits the cap. The
    folder is listed only when this process's running total (its last listing plus the `added`
    bytes of each put since) passes the cap: listing thousands of entries on every put cost
    0.1 s a put. Another process's writes are seen at the next listing."""
    cap, d = cap_bytes(), jit_dir()
    known = _listed_bytes.get(d)
    if known is not None and known + added <= cap:
        _listed_bytes[d] = known + added
        return
    found = entries()
    total = sum(e.size for e in found)
    for e in found:
        if total <= cap:
            break
        if e.path != keep:
            if _unlink(e.path):
                _log(f"jit cache: evicted {e.path.name} ({e.size} bytes; cap {cap} bytes)")
            total -= e.size
    _listed_bytes[d] = total


def clear() -> int:
    """Remove every entry and every stale tmp file (a live writer's is left alone); how many went."""
    stale = time.time() - STALE_TMP_S
    _listed_bytes.pop(jit_dir(), None)
    tmps = [p for p in jit_dir().glob(".*.tmp") if _mtime(p) < stale]
    return sum(_unlink(p) for p in [e.path for e in entries()] + tmps)


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:                 # gone meanwhile
        return float("inf")


def _unlink(p: Path) -> bool:
    try:
        p.unlink()
        return True
    except OSError:
        return False


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
