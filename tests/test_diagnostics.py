"""Diagnostics: each classic mistake is recognised, said once, counted, and cleared when it goes."""

from __future__ import annotations

import logging
import random
import time

import anyio
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from adaptive_gate import AdaptiveGate, Fixed, MemorySample
from adaptive_gate.diagnostics import CODES, Diagnostics
from adaptive_gate.testing import SimulatedGPU

from .helpers import client_for, find_gate, parse, wait_until

MiB = 1 << 20
GiB = 1 << 30
CARD = 16 * GiB


def active(diagnostics: Diagnostics) -> set[str]:
    return {f["code"] for f in diagnostics.findings() if f["active"]}


def finding(diagnostics: Diagnostics, code: str) -> dict[str, object]:
    return next(f for f in diagnostics.findings() if f["code"] == code)


# -- the event loop ---------------------------------------------------------------------------------


def test_a_habit_of_stalls_in_an_async_route_is_named() -> None:
    diagnostics = Diagnostics()
    routes = [("POST /predict", True), ("GET /other", False)]
    diagnostics.on_loop_stall(10.0, 0.02, routes)  # under the threshold: nothing
    diagnostics.on_loop_stall(11.0, 0.08, routes)
    diagnostics.on_loop_stall(12.0, 0.08, routes)
    assert active(diagnostics) == set()  # two may be the machine pausing
    diagnostics.on_loop_stall(13.0, 0.08, routes)
    assert active(diagnostics) == {"blocking_call_in_async_route"}
    found = finding(diagnostics, "blocking_call_in_async_route")
    assert "POST /predict" in str(found["message"]) and "GET /other" not in str(found["message"])
    assert "anyio.to_thread.run_sync" in str(found["advice"])


def test_stalls_far_apart_are_no_habit_but_one_long_stall_is_enough() -> None:
    diagnostics = Diagnostics(event_quiet_s=60)
    for t in (0.0, 100.0, 200.0):
        diagnostics.on_loop_stall(t, 0.08, [("POST /predict", True)])
    assert active(diagnostics) == set()
    diagnostics.on_loop_stall(300.0, 0.7, [])
    assert active(diagnostics) == {"event_loop_stalled"}  # nothing gated and async ran: something else


def test_a_stall_finding_clears_after_a_quiet_spell_and_counts_its_appearances(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="adaptive_gate")
    diagnostics = Diagnostics(event_quiet_s=30)
    for t in range(5):
        diagnostics.on_loop_stall(float(t), 0.9, [("POST /p", True)])
    assert len(caplog.records) == 1  # said once as it appeared, not at every stall
    tick = {"limit": 2, "min_limit": 1, "max_limit": 8, "queued": 0, "probe_errors_in_row": 0}
    diagnostics.on_tick(20.0, **tick)
    assert "blocking_call_in_async_route" in active(diagnostics)
    diagnostics.on_tick(40.0, **tick)
    assert active(diagnostics) == set()
    assert finding(diagnostics, "blocking_call_in_async_route")["active"] is False  # still listed, cleared
    diagnostics.on_loop_stall(50.0, 0.9, [("POST /p", True)])
    assert diagnostics.appearances()["blocking_call_in_async_route"] == 2
    assert len(caplog.records) == 2
    assert set(diagnostics.appearances()) == set(CODES)


# -- memory -------------------------------------------------------------------------------------------


def test_idle_memory_that_creeps_up_is_a_leak() -> None:
    diagnostics = Diagnostics()
    for second in range(0, 200):
        used = 2 * GiB + second * 2 * MiB  # two MiB a second while idle: 400 MiB in 200 s
        diagnostics.on_sample(float(second), MemorySample(used, CARD), in_flight=0, queued=0)
        if second == 100:
            assert active(diagnostics) == set()  # under two minutes: not judged yet
    assert active(diagnostics) == {"idle_memory_growth"}
    assert "MiB" in str(finding(diagnostics, "idle_memory_growth")["message"])


def test_busy_memory_and_flat_idle_memory_are_no_leak() -> None:
    diagnostics = Diagnostics()
    for second in range(0, 400):
        busy = second % 2 == 0
        used = 2 * GiB + (second * 10 * MiB if busy else 0)  # requests take more and more; idle stays put
        diagnostics.on_sample(float(second), MemorySample(used, CARD), in_flight=int(busy), queued=0)
    assert active(diagnostics) == set()


def test_a_leak_is_judged_on_this_process_tensors_where_pytorch_tells_them() -> None:
    diagnostics = Diagnostics()
    for second in range(0, 300):
        # A neighbour grows on the card; our own allocated bytes stay flat: not our leak.
        sample = MemorySample(2 * GiB + second * 4 * MiB, CARD, allocated_bytes=GiB, reserved_bytes=GiB)
        diagnostics.on_sample(float(second), sample, in_flight=0, queued=0)
    assert active(diagnostics) == set()


def test_the_leak_clears_when_memory_comes_back() -> None:
    diagnostics = Diagnostics(leak_window_s=200, leak_min_span_s=100)
    for second in range(0, 200):
        diagnostics.on_sample(float(second), MemorySample(GiB + second * 2 * MiB, CARD), in_flight=0, queued=0)
    assert active(diagnostics) == {"idle_memory_growth"}
    for second in range(200, 500):
        diagnostics.on_sample(float(second), MemorySample(GiB, CARD), in_flight=0, queued=0)
    assert active(diagnostics) == set()


def test_fragmentation_needs_a_wide_gap_that_lasts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    diagnostics = Diagnostics()
    wide = MemorySample(10 * GiB, CARD, allocated_bytes=3 * GiB, reserved_bytes=8 * GiB)  # 5 GiB gap of 16
    narrow = MemorySample(10 * GiB, CARD, allocated_bytes=7 * GiB, reserved_bytes=8 * GiB)
    for t in range(0, 9):
        diagnostics.on_sample(float(t), wide, in_flight=2, queued=0)
    diagnostics.on_sample(9.5, narrow, in_flight=2, queued=0)  # a blip: the clock starts over
    for t in range(10, 19):
        diagnostics.on_sample(float(t), wide, in_flight=2, queued=0)
    assert active(diagnostics) == set()
    diagnostics.on_sample(21.0, wide, in_flight=2, queued=0)
    assert active(diagnostics) == {"fragmentation"}
    assert "expandable_segments:True" in str(finding(diagnostics, "fragmentation")["advice"])
    diagnostics.on_sample(22.0, narrow, in_flight=2, queued=0)
    assert active(diagnostics) == set()


def test_fragmentation_advice_knows_expandable_segments_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    diagnostics = Diagnostics(fragmentation_for_s=0)
    diagnostics.on_sample(0.0, MemorySample(9 * GiB, CARD, allocated_bytes=GiB, reserved_bytes=8 * GiB), in_flight=1,
                          queued=0)  # fmt: skip
    assert "already on" in str(finding(diagnostics, "fragmentation")["advice"])


def test_several_processes_on_the_gpu_are_named() -> None:
    diagnostics = Diagnostics()
    diagnostics.on_sample(0.0, MemorySample(GiB, CARD, process_count=1), in_flight=0, queued=0)
    assert active(diagnostics) == set()
    diagnostics.on_sample(1.0, MemorySample(GiB, CARD, process_count=4), in_flight=0, queued=0)
    assert active(diagnostics) == {"shared_gpu"}
    assert "4 processes" in str(finding(diagnostics, "shared_gpu")["message"])
    diagnostics.on_sample(2.0, MemorySample(GiB, CARD), in_flight=0, queued=0)  # unknown: no change
    assert active(diagnostics) == {"shared_gpu"}
    diagnostics.on_sample(3.0, MemorySample(GiB, CARD, process_count=1), in_flight=0, queued=0)
    assert active(diagnostics) == set()


# -- the limit and the probe ---------------------------------------------------------------------------


def test_a_limit_stuck_at_the_minimum_with_demand_is_said() -> None:
    diagnostics = Diagnostics()
    stuck = {"limit": 1, "min_limit": 1, "max_limit": 8, "probe_errors_in_row": 0}
    for t in range(0, 59):
        diagnostics.on_tick(float(t), queued=3, **stuck)
    diagnostics.on_tick(59.5, queued=0, **stuck)  # a lull does not reset it, nor raise it
    assert active(diagnostics) == set()
    diagnostics.on_tick(60.0, queued=2, **stuck)
    assert active(diagnostics) == {"limit_at_minimum"}
    diagnostics.on_tick(61.0, queued=2, limit=2, min_limit=1, max_limit=8, probe_errors_in_row=0)
    assert active(diagnostics) == set()


def test_a_pinned_limit_is_never_stuck() -> None:
    diagnostics = Diagnostics(stuck_for_s=1)
    for t in range(0, 10):
        diagnostics.on_tick(float(t), limit=3, min_limit=3, max_limit=3, queued=5, probe_errors_in_row=0)
    assert active(diagnostics) == set()


def test_a_limit_held_at_the_maximum_beside_room_for_more_is_said() -> None:
    diagnostics = Diagnostics()
    capped = {"limit": 64, "min_limit": 1, "max_limit": 64, "probe_errors_in_row": 0}
    for t in range(0, 59):
        diagnostics.on_tick(float(t), queued=3, fits=256, **capped)
    diagnostics.on_tick(59.5, queued=0, fits=256, **capped)  # a lull does not reset it, nor raise it
    assert active(diagnostics) == set()
    diagnostics.on_tick(60.0, queued=2, fits=256, **capped)
    assert active(diagnostics) == {"limit_at_maximum"}
    said = finding(diagnostics, "limit_at_maximum")
    assert "max_limit=64 for 60 s" in str(said["message"]) and "room for 256 slots" in str(said["message"])
    assert "raise max_limit" in str(said["advice"])
    diagnostics.on_tick(61.0, queued=2, fits=64, **capped)  # no room for a slot more: the limit is the card's
    assert active(diagnostics) == set()


@pytest.mark.parametrize(
    ("limit", "min_limit", "fits"),
    [
        (63, 1, 256),  # below the maximum: the controller holds it there, not max_limit
        (64, 64, 256),  # pinned: the operator's choice
        (64, 1, None),  # no model of the card's memory (a `Fixed`, no probe): nothing to compare with
        (64, 1, 64),  # no slot more fits
    ],
)
def test_a_limit_at_the_maximum_is_not_said_where_nothing_is_held_back(
    limit: int, min_limit: int, fits: int | None
) -> None:
    diagnostics = Diagnostics(stuck_for_s=1)
    for t in range(0, 10):
        diagnostics.on_tick(
            float(t), limit=limit, min_limit=min_limit, max_limit=64, queued=5, probe_errors_in_row=0, fits=fits
        )
    assert active(diagnostics) == set()


def test_a_probe_that_keeps_failing_is_said_and_clears() -> None:
    diagnostics = Diagnostics()
    ok = {"limit": 2, "min_limit": 1, "max_limit": 8, "queued": 0}
    diagnostics.on_tick(0.0, probe_errors_in_row=4, **ok)
    assert active(diagnostics) == set()
    diagnostics.on_tick(1.0, probe_errors_in_row=5, **ok)
    assert active(diagnostics) == {"probe_failing"}
    diagnostics.on_tick(2.0, probe_errors_in_row=0, **ok)
    assert active(diagnostics) == set()


def test_thresholds_are_checked() -> None:
    with pytest.raises(ValueError, match="leak_min_span_s"):
        Diagnostics(leak_min_span_s=700, leak_window_s=600)
    # Each would have broken the monitor's tick (no strikes to count) or raised a finding at every one.
    with pytest.raises(ValueError, match="stall_strikes must be >= 1"):
        Diagnostics(stall_strikes=0)
    with pytest.raises(ValueError, match="loop_stall_s must be > 0 seconds"):
        Diagnostics(loop_stall_s=0)
    with pytest.raises(ValueError, match=r"fragmentation_fraction must be in \(0.0, 1.0\]"):
        Diagnostics(fragmentation_fraction=1.5)
    with pytest.raises(TypeError, match="probe_errors must be an int"):
        Diagnostics(probe_errors=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stuck_for_s must be >= 0 seconds"):
        Diagnostics(stuck_for_s=-1)
    with pytest.raises(ValueError, match=r"long_stall_s \(0.5\) must be >= loop_stall_s \(1\)"):
        Diagnostics(loop_stall_s=1, long_stall_s=0.5)  # every stall would have been a long one
    with pytest.raises(TypeError, match="wall_clock must be a callable"):
        Diagnostics(wall_clock=None)  # type: ignore[arg-type]  # it failed at the first finding, not here


# -- through the gate ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_gate_names_an_async_route_that_blocks_the_loop() -> None:
    # Any stall of 0.5 s is said at once, and no shorter one counts: the route blocks the loop for 1.2 s,
    # at least 1.1 s of it seen by a monitor that ticks every 0.1 s, far past the threshold however slow
    # the machine; a busy machine's own pauses of the loop stay far below it.
    app = FastAPI()
    diagnostics = Diagnostics(loop_stall_s=0.5, long_stall_s=0.5)
    app.add_middleware(AdaptiveGate, probe=None, controller=Fixed(4), diagnostics=diagnostics)

    @app.post("/blocking", tags=["gpu"])
    async def blocking() -> dict[str, bool]:
        time.sleep(1.2)  # noqa: ASYNC251 - the mistake under test: a blocking GPU call inside async def
        return {"ok": True}

    @app.post("/threaded", tags=["gpu"])
    def threaded() -> dict[str, bool]:
        time.sleep(1.2)  # the same work in a sync route runs in the thread pool: the loop stays free
        return {"ok": True}

    async with LifespanManager(app), client_for(app) as client:
        await anyio.sleep(0.3)  # the monitor's first ticks
        await client.post("/threaded")
        assert find_gate(app).status()["findings"] == []
        await client.post("/blocking")
        await wait_until(lambda: find_gate(app).status()["findings"])
        status = (await client.get("/gate/status")).json()
        samples = parse((await client.get("/gate/metrics")).text)
    found = status["findings"][0]
    assert found["code"] == "blocking_call_in_async_route" and "POST /blocking" in found["message"]
    assert "/threaded" not in found["message"]
    assert samples[("adaptive_gate_findings_total", (("code", "blocking_call_in_async_route"),))] == 1
    assert samples[("adaptive_gate_finding_active", (("code", "blocking_call_in_async_route"),))] == 1


@pytest.mark.anyio
async def test_the_gate_sees_other_processes_on_its_card(caplog: pytest.LogCaptureFixture) -> None:
    class SharedCard:
        def sample(self) -> MemorySample:
            return MemorySample(4 * GiB, CARD, process_count=3)

    caplog.set_level(logging.WARNING, logger="adaptive_gate")
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=SharedCard(), sample_period=0.01)
    async with LifespanManager(app), client_for(app) as client:
        await client.get("/gate/status")
        await wait_until(lambda: find_gate(app).statistics().probe.last_sample is not None)
        await anyio.sleep(0.1)  # several samples, one finding
        status = (await client.get("/gate/status")).json()
    assert [f["code"] for f in status["findings"]] == ["shared_gpu"]
    assert status["memory"]["process_count"] == 3
    assert len([r for r in caplog.records if "shared_gpu" in r.getMessage()]) == 1


def test_what_fits_is_the_model_s_level_with_room_for_a_mix_s_large_ones() -> None:
    from adaptive_gate import AIMD
    from adaptive_gate._gate.core import GateCore
    from adaptive_gate.simulation import Phase, simulate

    def mix(rng: random.Random) -> int:
        return int(rng.choice([0.25, 0.25, 0.25, 2.0]) * GiB)

    controller = AIMD()
    simulate(
        [Phase(0, 400, mix, 0.2)], total_bytes=24 * GiB, baseline_bytes=4 * GiB, duration_s=20,
        controller=controller, max_limit=23, seed=2,
    )  # fmt: skip
    memory = controller.memory
    assert memory.is_mix()
    room = memory.room()
    assert room is not None and room >= 24  # in mean requests: a slot more than max_limit...
    bounds = {"min_limit": 1, "initial_limit": None, "max_queue": 8, "max_retry_after_s": 60}
    # A gate of its own around the model learnt (an AIMD serves one gate: the simulation's)
    fits = GateCore(AIMD(memory=memory), max_limit=23, **bounds).fits(controller._now_s)
    assert fits == memory.cap(controller._now_s) and fits is not None and fits <= 23  # ...but no more fit

    class Bookkeeping:  # a custom controller's own `memory`, of another kind
        cap = 12.5

    class Own(Fixed):
        memory = Bookkeeping()

    assert GateCore(Own(4), max_limit=4, **bounds).fits(0.0) is None


@pytest.mark.anyio
async def test_the_gate_says_when_max_limit_holds_it_below_what_the_card_fits() -> None:
    gpu = SimulatedGPU(24 * GiB, baseline_bytes=8 * GiB)
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=gpu, sample_period=0.01, max_limit=2, diagnostics=Diagnostics(stuck_for_s=0))

    @app.post("/infer", tags=["gpu"])
    def infer() -> dict[str, bool]:
        with gpu.holding(GiB, 0.02):  # sixteen fit beside the weights
            return {"ok": True}

    async with LifespanManager(app) as manager, client_for(manager.app) as client:
        gate = find_gate(app)
        codes: list[str] = []

        async def clients() -> None:
            async def one() -> None:
                while not codes:
                    await client.post("/infer")

            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(one)

        async def watch() -> None:
            while not codes:
                status = (await client.get("/gate/status")).json()
                codes.extend(f["code"] for f in status["findings"] if f["active"])
                await anyio.sleep(0.05)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(clients)
                tg.start_soon(watch)
        assert gate.statistics().limit == 2
    assert codes == ["limit_at_maximum"]


class Rising(Fixed):
    """A limit of 1 that rises to 50 at the first answer: past the event loop's 40 threads."""

    def on_success(self, *, now_s: float, latency_s: float, concurrency: float, demand: bool) -> None:
        self._limit = 50


@pytest.mark.parametrize(
    ("sync_route", "threads", "warned"),
    [
        (True, None, True),  # 40 threads: at most 40 sync requests run, whatever the limit
        (True, 100, False),  # raised in the app's lifespan, as the warning says to
        (False, None, True),  # said as well: an async route may hand its work to run_in_threadpool
    ],
)
def test_a_limit_past_the_thread_pool_is_said_at_the_size_the_app_left_it(
    caplog: pytest.LogCaptureFixture, sync_route: bool, threads: int | None, warned: bool
) -> None:
    from collections.abc import AsyncIterator
    from contextlib import asynccontextmanager

    from starlette.testclient import TestClient

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if threads is not None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        yield

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(AdaptiveGate, probe=None, controller=Rising(1), initial_limit=1, max_limit=64)
    if sync_route:

        @app.post("/infer", tags=["gpu"])
        def infer() -> dict[str, bool]:
            return {"ok": True}
    else:

        @app.post("/infer", tags=["gpu"])
        async def infer_async() -> dict[str, bool]:
            return {"ok": True}

    with caplog.at_level(logging.WARNING, logger="adaptive_gate"), TestClient(app) as client:
        assert client.post("/infer").status_code == 200
        assert client.get("/gate/status").json()["limit"] == 50
    said = [r.getMessage() for r in caplog.records if "thread pool" in r.getMessage()]
    assert bool(said) == warned, said
    if warned:
        assert "limit reached 50" in said[0] and "40 tokens" in said[0]
