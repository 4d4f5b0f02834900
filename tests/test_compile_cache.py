"""The JIT object cache's size cap (backends/llvm/jit_cache.py): least recently used entries go
first, the entry just written stays, entries() lists them and clear() empties the folder.
Unit tier: fake ELF objects, no model, no LLVM."""
from __future__ import annotations

import os

import pytest

from bankml.backends.llvm import jit_cache

KB = 1024


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder for this test, the cache on and the cap at its default."""
    monkeypatch.setenv("BANKML_CACHE", str(tmp_path))
    monkeypatch.delenv("BANKML_JIT_CACHE", raising=False)
    monkeypatch.delenv("BANKML_JIT_CACHE_MB", raising=False)
    return tmp_path / "jit"


def cap_kb(monkeypatch, kb: float) -> None:
    monkeypatch.setenv("BANKML_JIT_CACHE_MB", str(kb / 1024))


def fake_obj(n: int, fill: int = 0) -> bytes:
    """An n-byte "object file": ELF magic and filler (the cache checks only the magic)."""
    return b"\x7fELF" + bytes([fill]) * (n - 4)


def put_at(k: str, n: int, when: float) -> None:
    """put() an n-byte object under k, then date its last use to `when` (seconds since the epoch)."""
    jit_cache.put(k, fake_obj(n))
    os.utime(jit_cache.entry_path(k), (when, when))


def names() -> list[str]:
    return [e.path.stem for e in jit_cache.entries()]


def test_entries_lists_size_and_last_use_oldest_first(cache):
    put_at("b", 10 * KB, 2000)
    put_at("a", 20 * KB, 3000)
    put_at("c", 5 * KB, 1000)
    es = jit_cache.entries()
    assert [e.path.stem for e in es] == ["c", "b", "a"]
    assert [e.last_used for e in es] == [1000, 2000, 3000]
    head = len(jit_cache.MAGIC) + 32
    assert [e.size for e in es] == [5 * KB + head, 10 * KB + head, 20 * KB + head]


def test_get_marks_the_entry_used(cache):
    put_at("a", KB, 1000)
    assert jit_cache.get("a") == fake_obj(KB)
    assert jit_cache.entries()[0].last_used > 1000


def test_put_evicts_the_least_recently_used_first(cache, monkeypatch):
    cap_kb(monkeypatch, 250)                       # room for two 100 KB entries, not three
    put_at("a", 100 * KB, 1000)
    put_at("b", 100 * KB, 2000)
    assert jit_cache.get("a") is not None      # a is now the most recently used
    jit_cache.put("c", fake_obj(100 * KB))
    assert sorted(names()) == ["a", "c"]


def test_cap_is_respected_after_every_put(cache, monkeypatch):
    cap_kb(monkeypatch, 250)
    for i in range(6):
        put_at(f"k{i}", 60 * KB, 1000 + i)
        assert sum(e.size for e in jit_cache.entries()) <= 250 * KB
    assert names() == ["k2", "k3", "k4", "k5"]     # the newest four fit (4 x 60 KB + headers)


def test_entry_just_written_is_kept_even_over_the_cap(cache, monkeypatch):
    put_at("old", 10 * KB, 1000)
    cap_kb(monkeypatch, 50)
    jit_cache.put("big", fake_obj(100 * KB))
    assert names() == ["big"]
    assert jit_cache.get("big") == fake_obj(100 * KB)


def test_the_just_written_entry_is_kept_when_it_is_not_the_newest_on_disk(cache, monkeypatch):
    """A clock that went back, or another process touching an entry: keep still wins."""
    put_at("future", 100 * KB, 4_000_000_000)
    cap_kb(monkeypatch, 150)
    jit_cache.put("new", fake_obj(100 * KB))
    assert names() == ["new"]


def test_zero_cap_keeps_only_the_last_entry(cache, monkeypatch):
    cap_kb(monkeypatch, 0)
    put_at("a", KB, 1000)
    jit_cache.put("b", fake_obj(KB))
    assert names() == ["b"]


def test_puts_list_the_folder_only_when_the_cap_may_be_passed(cache, monkeypatch):
    """A put lists the folder (a stat per entry) once, then keeps a running total until it
    passes the cap; over the cap, it lists again and evicts."""
    listings = []
    real = jit_cache.entries
    monkeypatch.setattr(jit_cache, "entries", lambda: listings.append(1) or real())
    cap_kb(monkeypatch, 250)
    for k in ("a", "b"):
        put_at(k, 100 * KB, 1000 if k == "a" else 2000)
    assert len(listings) == 1
    jit_cache.put("c", fake_obj(100 * KB))
    assert len(listings) == 2
    assert sorted(names()) == ["b", "c"]


@pytest.mark.parametrize("value", ["", "lots", "  "])
def test_bad_or_empty_cap_means_512_mb(monkeypatch, value):
    monkeypatch.setenv("BANKML_JIT_CACHE_MB", value)
    assert jit_cache.cap_bytes() == 512 * 1024 * 1024


def test_default_cap_is_512_mb(monkeypatch):
    monkeypatch.delenv("BANKML_JIT_CACHE_MB", raising=False)
    assert jit_cache.cap_bytes() == 512 * 1024 * 1024


def test_corrupt_entry_is_still_ignored_and_evicted_first(cache, monkeypatch):
    put_at("bad", 100 * KB, 2000)
    path = jit_cache.entry_path("bad")
    data = path.read_bytes()
    path.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])   # a flipped bit
    os.utime(path, (1000, 1000))
    assert jit_cache.get("bad") is None
    assert jit_cache.entries()[0].last_used == 1000                # not marked used
    put_at("good", 100 * KB, 1500)                 # older than "bad" was before it went bad
    cap_kb(monkeypatch, 250)
    jit_cache.put("new", fake_obj(100 * KB))
    assert sorted(names()) == ["good", "new"]


def test_clear_counts_entries_and_stale_tmp_files(cache):
    for k in ("a", "b", "c"):
        jit_cache.put(k, fake_obj(KB))
    stale = cache / ".deadbeef.x1.tmp"
    live = cache / ".cafef00d.x2.tmp"
    stale.write_bytes(b"torn")
    live.write_bytes(b"being written")
    os.utime(stale, (1000, 1000))
    assert jit_cache.clear() == 4
    assert jit_cache.entries() == []
    assert sorted(p.name for p in cache.iterdir()) == [live.name]       # a live writer's tmp stays
    assert jit_cache.get("a") is None


def test_clear_of_a_missing_folder_is_zero(cache):
    assert jit_cache.clear() == 0 and jit_cache.entries() == []


def test_disabled_cache_neither_writes_nor_evicts(cache, monkeypatch):
    put_at("a", 100 * KB, 1000)
    cap_kb(monkeypatch, 50)
    monkeypatch.setenv("BANKML_JIT_CACHE", "0")
    jit_cache.put("b", fake_obj(KB))
    assert names() == ["a"]


def test_counts_tally_this_process_hits_misses_and_puts(cache, monkeypatch):
    monkeypatch.setattr(jit_cache, "counts", {"hit": 0, "miss": 0, "put": 0})
    jit_cache.get("a")                          # missing
    jit_cache.put("a", fake_obj(KB))
    jit_cache.get("a")
    jit_cache.entry_path("a").write_bytes(b"garbage")
    jit_cache.get("a")                          # corrupt
    assert jit_cache.counts == {"hit": 1, "miss": 2, "put": 1}
