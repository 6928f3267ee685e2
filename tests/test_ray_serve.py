"""The gate inside Ray Serve: `examples/ray_serve/app.py` on a local Ray, on 127.0.0.1, as a subprocess.

A gated route's 503 + Retry-After must come through Ray's HTTP proxy to the client unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from adaptive_gate._observe.workers import proc_stat_fields

from .servers import free_port, wait_until_healthy

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_serve" / "app.py"

pytestmark = pytest.mark.slow


def reap_session(session_id: int, timeout_s: float = 30.0) -> None:
    """Ray's own processes (raylet, GCS, workers) live in the example's session: end them all and
    wait until they are gone, so that no CPU is still taken by them when the next test starts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        members = [pid for pid in _pids() if _session_of(pid) == session_id]
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    raise AssertionError(f"processes of session {session_id} outlived the Ray example")


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _session_of(pid: int) -> int | None:
    fields = proc_stat_fields(pid)
    return None if fields is None else int(fields[3])  # state, ppid, pgrp, session


def test_a_gated_503_comes_through_ray_serve(tmp_path: Path) -> None:
    import ray  # noqa: F401

    port = free_port()
    env = {**os.environ, "GATE_MAX_LIMIT": "1", "GATE_MAX_QUEUE": "0", "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "ray.log"  # a file, not a pipe that nobody reads while Ray logs
    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, "the Ray Serve example", timeout_s=180)
        assert httpx.post(f"{url}/predict", json={"rows": 8}, timeout=60).status_code == 200

        def post(_: int) -> httpx.Response:
            return httpx.post(f"{url}/predict", json={"rows": 4096}, timeout=60)

        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(post, range(8)))
        status = httpx.get(f"{url}/gate/status", timeout=10).json()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        reap_session(process.pid)
        log.close()
    output = log_path.read_text()

    codes = [response.status_code for response in responses]
    assert set(codes) <= {200, 503} and 200 in codes and 503 in codes, codes
    for response in responses:
        if response.status_code == 503:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["reason"] == "queue_full"
    # The gate in the replica counted what the client saw.
    assert status["counters"]["rejected"] == codes.count(503)
    assert status["counters"]["completed"] == codes.count(200) + 1
    assert status["limit"] == 1 and status["in_flight"] == 0
    assert "serving on" in output
