"""Test tiers: unit (no model), backend, oracle (@pytest.mark.oracle, needs the llama.cpp build)."""
from __future__ import annotations

import os

import pytest

from bankml.oracle.paths import bin_dir


def pytest_collection_modifyitems(config, items):
    """An oracle test may not quietly skip: in CI (CI=true) a missing build fails it."""
    if (bin_dir() / "libllama.so").exists():
        return
    needs = [item for item in items if "oracle" in item.keywords]
    if needs and os.environ.get("CI"):
        raise pytest.UsageError(f"{len(needs)} oracle tests but no oracle build in {bin_dir()}")
    for item in needs:
        item.add_marker(pytest.mark.skip(reason="oracle build missing: python -m bankml.oracle build"))
