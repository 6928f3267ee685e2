"""A closed loop (a pool of clients, each sending its next request when the last is answered) is
never in overload: its line is as long as it has clients, and first come, first served answers all
of them within their deadlines. Under every `overload` mode: no 503 that the card did not cause."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from hypothesis import example, given, settings
from hypothesis import strategies as st

from adaptive_gate import AdaptiveGate, Fixed
from adaptive_gate.testing import SimulatedGPU
from benchmarks.overload import Flow, Replay, capacity_per_s

from .helpers import find_gate, frozen_heap

MODES = ["lifo", "shed", "off"]
GiB = 1 << 30
NOT_THE_CARD = ("deadline", "overload", "evicted", "queue_full")  # what a closed loop must never see


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clients", [8, 24, 128])
def test_a_closed_loop_is_served_in_full_on_virtual_time(mode: str, clients: int) -> None:
    replay = Replay([Flow(0.0, deadline_s=60.0, clients=clients, pause_s=0.05)], overload=mode, seed=clients,
                    max_queue=512)  # fmt: skip
    [result] = replay.run(20.0)
    assert result.rejected == 0 and result.late == 0
    assert result.on_time >= 0.95 * 20.0 * capacity_per_s()  # the card kept busy
    assert replay.stood_s == 0.0
    assert replay.core.detector is None or replay.core.detector.episodes == 0


@settings(max_examples=40, deadline=None)
@example(clients=300, limit=6, service_s=0.5, mode="lifo", seed=0, units=0.25)  # counts on unaligned buckets
@given(
    clients=st.integers(1, 300),
    limit=st.integers(1, 8),
    service_s=st.floats(0.001, 0.5),
    mode=st.sampled_from(["lifo", "shed"]),
    seed=st.integers(0, 1000),
    units=st.sampled_from([1.0, 0.25, 0.625, 2.0, 4.0, 10.0]),  # 64ths, as `cost` is counted
)
def test_no_closed_loop_is_ever_in_overload(
    clients: int, limit: int, service_s: float, mode: str, seed: int, units: float
) -> None:
    """Whatever its size against the slots, however long the work, and whatever each request weighs
    (`cost`, above the limit too: such a request runs alone): deadlines long enough for first come,
    first served (each client's turn comes within clients / (those that run at once) service times)."""
    at_once = max(1, int(limit / units))
    deadline_s = 3.0 * (clients / at_once + 2) * service_s + 1.0
    replay = Replay([Flow(0.0, deadline_s=deadline_s, clients=clients, units=units)], overload=mode, seed=seed,
                    max_queue=clients, limit=limit, service_s=service_s)  # fmt: skip
    [result] = replay.run(60 * service_s * max(1.0, clients / limit))
    assert result.rejected == 0
    assert replay.stood_s == 0.0


async def _closed_loop(app: Any, clients: int, requests: int, gate_seen: list[AdaptiveGate]) -> dict[int, int]:
    """`clients` tasks sending `requests` in all, each the next when answered; the status is read
    throughout and must never say the queue stands."""
    statuses: dict[int, int] = {}
    sent = 0
    stood: list[dict[str, Any]] = []
    done = anyio.Event()
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as client:

        async def worker() -> None:
            nonlocal sent
            while sent < requests:
                sent += 1
                response = await client.post("/predict")
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        async def watch() -> None:
            while not done.is_set():
                await anyio.sleep(0.01)
                if gate_seen:
                    overload = gate_seen[0].status()["overload"]
                    if overload["standing"]:
                        stood.append(overload)
                else:
                    try:
                        gate_seen.append(find_gate(app))
                    except LookupError:
                        pass  # not built before the first request

        with frozen_heap():  # a measurement of the gate on the real clock, not of a full collection's stall
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(watch)
                async with anyio.create_task_group() as workers:
                    for _ in range(clients):
                        workers.start_soon(worker)
                done.set()
    assert stood == []
    return statuses


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clients", [8, 24, 128])
async def test_a_closed_loop_through_the_gate_gets_no_503(mode: str, clients: int) -> None:
    """Three slots, 20 ms of work, a pool of clients through the middleware on the real clock."""
    app = FastAPI()
    app.add_middleware(AdaptiveGate, controller=Fixed(3), probe=None, overload=mode, queue_timeout=60,
                       max_queue=512)  # fmt: skip

    @app.post("/predict", tags=["gpu"])
    async def predict() -> dict[str, bool]:
        await anyio.sleep(0.02)
        return {"ok": True}

    gate: list[AdaptiveGate] = []
    requests = max(150, 2 * clients)
    statuses = await _closed_loop(app, clients, requests, gate)
    assert statuses == {200: requests}
    rejected = gate[0].status()["counters"]["rejected_by_reason"]
    assert all(rejected.get(reason, 0) == 0 for reason in NOT_THE_CARD)
    assert gate[0].status()["overload"].get("episodes", 0) == 0


@pytest.mark.anyio
@pytest.mark.parametrize("mode", MODES)
async def test_a_closed_loop_on_a_simulated_card_gets_only_the_cards_503s(mode: str) -> None:
    """The default controller learning a 24 GiB card with 8 GiB of weights, 3 GiB a request (five
    fit), 24 clients: an OOM while it learns is the card's doing; nothing else is turned away."""
    gpu = SimulatedGPU(24 * GiB, baseline_bytes=8 * GiB)
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=gpu, sample_period=0.05, initial_limit=8, overload=mode,
                       queue_timeout=60, max_queue=512)  # fmt: skip

    @app.post("/predict", tags=["gpu"])
    async def predict() -> dict[str, bool]:
        with gpu.allocate(3 * GiB):
            await anyio.sleep(0.05)
        return {"ok": True}

    gate: list[AdaptiveGate] = []
    statuses = await _closed_loop(app, 24, 300, gate)
    rejected = gate[0].status()["counters"]["rejected_by_reason"]
    assert all(rejected.get(reason, 0) == 0 for reason in NOT_THE_CARD), rejected
    assert statuses.get(200, 0) + rejected.get("oom", 0) == 300
    # How many OOMs the learning costs here depends on how late the readings reach a loaded event
    # loop (1 to 13 seen in 300 requests); the controller's OOM targets are held on virtual time
    # (tests/test_targets.py). Here: the OOMs stay a small part of the answers.
    assert statuses.get(200, 0) >= 270


@pytest.mark.parametrize("mode", ["lifo", "shed"])
def test_one_impatient_request_does_not_put_a_closed_loop_in_overload(mode: str) -> None:
    """Found in review: one request with a 0.1 s deadline, turned away as it must be, put the whole
    gate in overload, and newest first then turned away the patient clients for the rest of the run."""
    flows = [Flow(0.0, deadline_s=2.5, clients=128, pause_s=0.05), Flow(0.2, deadline_s=0.1)]
    replay = Replay(flows, overload=mode, seed=1, max_queue=512)
    patient, impatient = replay.run(20.0)
    assert patient.rejected == 0 and impatient.on_time + impatient.rejected == impatient.offered
    assert replay.stood_s == 0.0
