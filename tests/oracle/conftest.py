"""Fixtures of the oracle tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _close_loaded_models(request):
    """The models a test module kept in its `_loaded` dict give back their compiled code and
    arenas at the module's end."""
    yield
    loaded = getattr(request.module, "_loaded", None)
    for m in (loaded or {}).values():
        m.close()
    if loaded is not None:
        loaded.clear()
