"""Fixtures for the server tests: `bankml serve` subprocesses (bankml.testing.serve)."""
from __future__ import annotations

import os

import pytest

from bankml.testing.serve import BankmlServer


@pytest.fixture(scope="module")
def bankml_server_factory():
    started: list[BankmlServer] = []

    def start(model: str, *args: str) -> BankmlServer:
        srv = BankmlServer(model, *args)
        started.append(srv)
        return srv
    yield start
    for srv in started:
        srv.close()
        os.unlink(srv._log.name)
