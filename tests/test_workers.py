"""Several workers on one GPU: the worker count in the status, and gates that share one card."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from adaptive_gate import AdaptiveGate
from adaptive_gate._observe.workers import detect_workers
from adaptive_gate.testing import SimulatedGPU

from .helpers import CARD, GiB, classic_app, find_gate, hammer
from .servers import free_port

WEIGHTS = 4 * GiB  # each worker loads its own copy of the model


def test_the_worker_count_comes_from_the_option_then_web_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    assert detect_workers(3) == (3, "workers option")
    assert detect_workers(None) == (4, "WEB_CONCURRENCY")
    monkeypatch.setenv("WEB_CONCURRENCY", "lots")
    count, source = detect_workers(None)
    assert count == 1 and source.startswith("assumed")  # pytest's parent is no server
    gate = AdaptiveGate(FastAPI(), probe=None, workers=2)
    assert gate.status()["workers"]["count"] == 2


def test_uvicorn_workers_are_counted_by_each_worker() -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "WEB_CONCURRENCY"}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.worker_app:app", "--workers", "2", "--port", str(port),
         "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        pids = set()
        while len(pids) < 2:
            assert time.monotonic() < deadline, "did not reach both workers"
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/gate/status", timeout=2).json()
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            assert status["workers"]["count"] == 2, status["workers"]
            assert status["workers"]["source"] == "worker processes of the server"
            pids.add(status["workers"]["pid"])
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)


@pytest.mark.slow
@pytest.mark.anyio
async def test_two_gates_on_one_card_stay_within_it_together() -> None:
    """Two gates, each reading the whole card and the other's requests on it, learn to share it.
    (One simulated card in one process: its own count and OOM count are both gates', where each
    worker's `torch` probe would tell its own: the limitation in docs/benchmarks.md measures both.)"""
    gpu = SimulatedGPU(CARD, baseline_bytes=2 * WEIGHTS, knee=16)  # 16 GiB left: five 3 GiB requests
    first, second = classic_app(gpu, [3 * GiB]), classic_app(gpu, [3 * GiB])
    async with LifespanManager(first), LifespanManager(second):
        async with anyio.create_task_group() as tg:  # learning, together
            tg.start_soon(hammer, first, 4.0, 8)
            tg.start_soon(hammer, second, 4.0, 8)
        gates = find_gate(first), find_gate(second)
        ooms_learning = gpu.oom_count
        results: list[tuple[dict[int, int], float]] = []

        async def settled(app: FastAPI) -> None:
            results.append(await hammer(app, 4.0, 8))

        async with anyio.create_task_group() as tg:
            tg.start_soon(settled, first)
            tg.start_soon(settled, second)
    for codes, _ in results:
        assert codes.get(200, 0) > 20 and set(codes) <= {200, 503}
    for gate in gates:
        assert gate.statistics().in_flight == 0 and gate.status()["memory"] is not None
    together = sum(limit for _, limit in results)
    settled_ooms = gpu.oom_count - ooms_learning
    if ooms_learning > 6 or settled_ooms > 2:
        # The limitation docs/benchmarks.md states ("Two gates on one card"): each gate reads the
        # other's requests as a neighbour's bytes, which come and go between readings, and their lulls
        # look like room, so that now and then both grow at once, and both then hold back for the
        # OOMs that follow. Over a hundred runs the limits summed to 2 to 7, outside 3-5 only in runs
        # with more than 2 OOMs settled (more than 6 while learning came in 2 runs of 60). Such a run
        # is held to that range: the gates share the card without coordinating, and answer each OOM
        # with a 503 (asserted above), not a crash.
        assert 2 <= together <= 7, (ooms_learning, settled_ooms, together)
    else:
        assert 3 <= together <= 5  # five fit; each sees the other's requests as a neighbour, so a little less
