"""Shared llama-server oracles for tests/runtime (one process per model and test session)."""
from __future__ import annotations

import pytest

from bankml.testing import models


@pytest.fixture(scope="session")
def servers():
    from bankml.oracle.server import LlamaServer
    made: dict[str, LlamaServer] = {}

    def get(name: str) -> LlamaServer:
        if name not in made:
            made[name] = LlamaServer(models.path(name), threads=2)
        return made[name]
    yield get
    for srv in made.values():
        srv.close()
