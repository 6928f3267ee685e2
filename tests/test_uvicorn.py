"""The gate behind a real uvicorn on 127.0.0.1: concurrent clients, real disconnects, chaos."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from adaptive_gate import AdaptiveGate, Fixed

from .helpers import find_gate
from .servers import serve, wait_for


def slow_app(work_s: float | threading.Event, **options: Any) -> tuple[FastAPI, dict[str, int]]:
    """A sync gated route that works `work_s` seconds, or until that event is set."""
    app = FastAPI()
    options.setdefault("probe", None)
    app.add_middleware(AdaptiveGate, **options)
    seen = {"running": 0, "peak": 0}
    lock = threading.Lock()

    @app.post("/infer", tags=["gpu"])
    def infer(fail: bool = False) -> dict[str, int]:
        with lock:
            seen["running"] += 1
            seen["peak"] = max(seen["peak"], seen["running"])
        try:
            if isinstance(work_s, threading.Event):
                work_s.wait(30)  # set by the test; the timeout is a guard against a hang
            else:
                time.sleep(work_s)
            if fail:
                raise ValueError("model bug")
            return {"ok": 1}
        finally:
            with lock:
                seen["running"] -= 1

    return app, seen


def test_concurrent_clients_through_uvicorn() -> None:
    app, seen = slow_app(0.05, controller=Fixed(3), max_queue=10, queue_timeout=5)
    with serve(app) as url:

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                return list(await asyncio.gather(*(client.post("/infer") for _ in range(32))))

        responses = asyncio.run(burst())
        status = httpx.get(f"{url}/gate/status").json()
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503} and codes.count(200) >= 13  # 3 running + 10 queued at least
    for response in responses:
        if response.status_code == 503:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["reason"] in {"queue_full", "deadline"}
    assert seen["peak"] == 3
    assert status["in_flight"] == 0 and status["queued"] == 0
    assert status["counters"]["completed"] == codes.count(200)


def test_real_disconnect_while_queued() -> None:
    release = threading.Event()
    app, seen = slow_app(release, controller=Fixed(1))
    with serve(app) as url:
        port = int(url.rsplit(":", 1)[1])
        with httpx.Client(base_url=url, timeout=30) as client:
            holder = threading.Thread(target=lambda: client.post("/infer"))
            holder.start()
            try:
                wait_for(lambda: seen["running"] == 1)
                gate = find_gate(app)
                leaver = socket.create_connection(("127.0.0.1", port))
                leaver.sendall(b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
                wait_for(lambda: gate.statistics().queued == 1)
                leaver.close()  # the client gives up while waiting
                wait_for(lambda: gate.statistics().queued == 0)
                assert seen["running"] == 1  # at once, not when the slot frees: it is still held
                assert gate.statistics().counters["left_queue"] == 1
            finally:
                release.set()
                holder.join()
        wait_for(lambda: gate.statistics().in_flight == 0)
    assert gate.statistics().counters["admitted"] == 1


@pytest.mark.slow
def test_chaos_through_uvicorn() -> None:
    """Clients that time out at random moments, routes that fail: every slot comes back."""
    app, _ = slow_app(0.01, initial_limit=4, max_queue=30, queue_timeout=0.5)
    rng = random.Random(3)
    with serve(app) as url:

        async def one(client: httpx.AsyncClient) -> str:
            fail = rng.random() < 0.1
            timeout_s = rng.choice([0.005, 0.02, 0.1, 30])
            try:
                response = await client.post(f"/infer?fail={str(fail).lower()}", timeout=timeout_s)
            except httpx.TimeoutException:
                return "client gave up"
            return str(response.status_code)

        async def chaos() -> list[str]:
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=url, limits=limits) as client:
                outcomes: list[str] = []
                for _ in range(6):
                    outcomes += await asyncio.gather(*(one(client) for _ in range(50)))
                return outcomes

        outcomes = asyncio.run(chaos())
        gate = find_gate(app)
        wait_for(lambda: gate.statistics().in_flight == 0 and gate.statistics().queued == 0)
    assert {"200", "500", "client gave up"} <= set(outcomes)
    assert set(outcomes) <= {"200", "500", "503", "client gave up"}
