"""Servers the tests start as subprocesses or threads: a free loopback port, and waiting for one."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn


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


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run `app` under uvicorn in a thread on a free loopback port; stop it cleanly afterwards."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30  # a guard against a hang, not a measure: a busy machine may be slow
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "uvicorn did not stop"


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll until `predicate` holds. The timeout only catches a hang."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)
