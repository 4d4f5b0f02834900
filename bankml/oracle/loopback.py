"""A server process on loopback, as the tests run two: llama-server (oracle/server.py) and
`bankml serve` (testing/serve.py). A free port, the wait for /health, the stop.

    port = free_port()
    proc = subprocess.Popen([..., "--port", str(port)])
    wait_for_health(proc, f"http://127.0.0.1:{port}", 120.0, "llama-server", log=tail)
    stop(proc)
"""
from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import Callable

from bankml.errors import OracleError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_health(proc: subprocess.Popen, url: str, timeout_s: float, what: str, log: Callable[[], str],
                    error: type[Exception] = OracleError, poll_s: float = 0.2) -> None:
    """Until GET url/health answers 200; `error` (with the log's tail) if the process exits first
    or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise error(f"{what} exited with {proc.returncode}: {log()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(poll_s)
    raise error(f"{what} not ready after {timeout_s:.0f}s: {log()[-2000:]}")


def stop(proc: subprocess.Popen, timeout_s: float) -> None:
    """terminate, then kill if it has not ended after timeout_s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)
