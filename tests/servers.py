"""Servers the tests start as subprocesses or threads: a free loopback port, and waiting for one."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_healthy(
    url: str, process: subprocess.Popen[str] | subprocess.Popen[bytes], what: str, timeout_s: float = 120
) -> None:
    """Poll `{url}/healthz` until it answers 200; fail at once if the process exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, f"{what} exited during start-up"
        assert time.monotonic() < deadline, f"{what} did not start within {timeout_s} s"
        time.sleep(0.2)
