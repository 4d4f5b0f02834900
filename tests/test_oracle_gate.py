"""Without the llama.cpp build, selecting oracle tests fails the run; it never skips them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pytest_in(oracle_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BANKML_ORACLE_DIR": str(oracle_dir)}
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_oracle_tests_without_the_build_fail_the_run(tmp_path):
    r = pytest_in(tmp_path, "tests/oracle/test_named_tensors.py", "tests/oracle/test_build.py")
    assert r.returncode == 4, r.stdout + r.stderr            # pytest's usage error
    out = r.stdout + r.stderr
    n = re.search(r"(\d+) oracle tests selected but no llama.cpp oracle build", out)
    assert n and int(n[1]) > 0, out
    assert "python -m bankml.oracle build" in out and '-m "not oracle"' in out


def test_deselecting_oracle_tests_runs_the_rest(tmp_path):
    r = pytest_in(tmp_path, "tests/oracle/test_named_tensors.py", "tests/oracle/test_build.py", "-m", "not oracle")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "test_build.py::test_failed_build_is_one_line_naming_its_log" in r.stdout
