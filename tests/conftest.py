"""Test tiers: unit (no model), backend, oracle (@pytest.mark.oracle, needs the llama.cpp build).

Every test runs with BANKML_VERIFY=1: the IR verifier checks each graph after every pass.
An oracle test never quietly skips: without the build, a run that selects oracle tests stops
with a usage error, locally as in CI. `-m "not oracle"` deselects them on purpose.
"""
from __future__ import annotations

import os

import pytest

from bankml.oracle.paths import bin_dir
from bankml.testing import models

# every graph run_passes makes is checked after each pass (bankml/ir/verify.py), in this process
# and in the bankml processes tests start (they inherit the environment)
os.environ["BANKML_VERIFY"] = "1"


@pytest.hookimpl(trylast=True)              # after -m / -k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    if (bin_dir() / "libllama.so").exists():
        return
    needs = [item for item in items if item.get_closest_marker("oracle")]
    if needs:
        raise pytest.UsageError(f"{len(needs)} oracle tests selected but no llama.cpp oracle build in {bin_dir()}: "
                                "build it with `python -m bankml.oracle build` (about 6 minutes), "
                                "or deselect them with -m \"not oracle\"")


@pytest.fixture(scope="session")
def oracle_results(pytestconfig):
    """The run's results file (see bankml/testing/oracle_results.py), started by its first comparison."""
    from bankml.testing.oracle_results import Recorder, results_path
    args = " ".join(pytestconfig.invocation_params.args)
    return Recorder(results_path(), command=f"python -m pytest {args}".rstrip())


@pytest.fixture
def record(oracle_results, request):
    """record(kind=..., model=..., compared=N, identical=M, ...): one comparison of this test."""
    def rec(**comparison) -> None:
        oracle_results.record(test=request.node.nodeid, **comparison)
    return rec


@pytest.fixture(scope="session")
def servers():
    """Shared llama-server oracles (one process per model and test session)."""
    from bankml.oracle.server import LlamaServer
    made: dict[str, LlamaServer] = {}

    def get(name: str) -> LlamaServer:
        if name not in made:
            made[name] = LlamaServer(models.path(name), threads=2)
        return made[name]
    yield get
    for srv in made.values():
        srv.close()
