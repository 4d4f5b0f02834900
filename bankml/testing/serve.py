"""`bankml serve` as a subprocess (for tests) on a free loopback port, waited for through /health.

    with BankmlServer("smollm2-q4_1", "--parallel", "2") as srv:
        httpx.post(srv.url + "/v1/chat/completions", json=...)

The server's stderr goes to a file the test can read (srv.log()), and the process is always
ended (terminate, then kill) when the block or the fixture ends.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bankml.oracle.loopback import free_port, stop, wait_for_health
from bankml.testing import models

REPO = Path(__file__).resolve().parents[2]          # the checkout: the server runs this bankml
START_TIMEOUT_S = 180.0


class BankmlServer:
    def __init__(self, model: str, *args: str, threads: int = 2, env: dict | None = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+b", suffix=".log", delete=False)
        env = {**(os.environ if env is None else env)}
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "bankml.cli", "serve", str(models.path(model)), "--host", "127.0.0.1",
               "--port", str(self.port), "--threads", str(threads), *args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        try:
            wait_for_health(self.proc, self.url, start_timeout_s, "bankml serve", self.log, error=RuntimeError,
                            poll_s=0.3)
        except BaseException:
            self.close()
            raise

    def log(self) -> str:
        return Path(self._log.name).read_text("utf-8", "replace")

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def close(self) -> None:
        stop(self.proc, 15)
        self._log.close()

    def __enter__(self) -> "BankmlServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


