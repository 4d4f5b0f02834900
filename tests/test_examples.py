"""examples/ run end to end."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bankml.testing import models

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.oracle
def test_custom_architecture_runs_and_equals_llama_cpp():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_architecture.py"),
                        str(models.path("llama-gqa-f16"))], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "equal to the built-in llama graph: True" in r.stdout
    assert "equal to llama.cpp: True" in r.stdout
