"""`adaptive_gate._batch.probe`: the batcher's probe, resolved once there is an answer, and its threads
ended with the batched function."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from adaptive_gate import AdaptiveGate, MemorySample, batch
from adaptive_gate._batch import probe as _batch_probe
from adaptive_gate.testing import SimulatedGPU

from .helpers import client_for

pytestmark = pytest.mark.anyio

MiB, GiB = 2**20, 2**30
THREAD_NAMES = ("adaptive-gate-probe", "adaptive-gate-batch-peak")


async def test_a_leader_cancelled_while_the_auto_probe_starts_leaves_the_batcher_a_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = SimulatedGPU(GiB)
    starting, go = threading.Event(), threading.Event()

    def slow_auto_probe() -> tuple[SimulatedGPU, str]:
        starting.set()
        go.wait(30)  # like torch's first CUDA call
        return gpu, "probe: simulated"

    monkeypatch.setattr(_batch_probe, "auto_probe", slow_auto_probe)

    @batch(max_wait_s=0.0)  # probe="auto"
    def echo(items: list[int]) -> list[int]:
        return items

    scope = anyio.CancelScope()

    async def first() -> None:
        with scope:
            await echo(1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await anyio.to_thread.run_sync(starting.wait)
        scope.cancel()  # the first client gives up while the probe starts
    assert scope.cancelled_caught
    go.set()
    with anyio.fail_after(10):
        while echo._probe._thread.busy_since_s is not None:  # noqa: ASYNC110 (no event says the abandoned start returned)
            await anyio.sleep(0.001)
    assert await echo(2) == 2
    assert echo._probe.probe is gpu and echo.statistics().probe == "probe: simulated"


async def test_a_batched_function_collected_ends_its_threads() -> None:
    before = set(threading.enumerate())
    echo = batch(probe=SimulatedGPU(GiB), max_wait_s=0.0)(lambda items: items)
    assert await echo(1) == 1
    threads = [t for t in threading.enumerate() if t not in before and t.name in THREAD_NAMES]
    assert sorted(t.name for t in threads) == sorted(THREAD_NAMES)
    del echo
    gc.collect()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), f"{thread.name} outlived its batched function"


# -- behind a gate: one view of the card ------------------------------------------------------------


@asynccontextmanager
async def served(gate: AdaptiveGate) -> AsyncIterator[httpx.AsyncClient]:
    """The gate with its lifespan running (its sampler reads the card), and a client for it."""
    async with LifespanManager(gate), client_for(gate) as client:
        yield client


async def test_a_batcher_behind_a_gate_is_collected_with_its_threads_once_both_are_dropped() -> None:
    """The batcher holds the gate's sampler weakly: the gate's options hold the batcher (its
    controller), and a strong way back kept both, the peak watch's thread and the app, for good."""
    before = set(threading.enumerate())

    async def serve() -> weakref.ref[Any]:  # its frame, the client and the gate end with it
        gpu = SimulatedGPU(2 * GiB, baseline_bytes=200 * MiB)
        gate, run = gated_batcher(gpu, gpu)
        async with served(gate) as client:
            await post_rounds(client, 1, n=4)
        return weakref.ref(run)

    batcher = await serve()
    threads = [t for t in threading.enumerate() if t not in before and t.name in THREAD_NAMES]
    assert "adaptive-gate-batch-peak" in {t.name for t in threads}
    for thread in threads:  # the gate's sampler thread ends a moment after its lifespan
        if thread.name == "adaptive-gate-probe":
            await anyio.to_thread.run_sync(thread.join, 10)  # not on the loop: its last answer goes through it
    gc.collect()
    assert batcher() is None, "the batcher outlived its gate and every reference to it"
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), f"{thread.name} outlived the gate and its batcher"


class ThreadsThatRead:
    """A probe that records the thread of each reading (and fails where told to)."""

    def __init__(self, gpu: SimulatedGPU, *, fails: bool = False) -> None:
        self.gpu = gpu
        self.fails = fails
        self.threads: list[tuple[str, int | None]] = []

    def sample(self) -> MemorySample:
        thread = threading.current_thread()
        self.threads.append((thread.name, thread.ident))
        if self.fails:
            raise RuntimeError("NVML: GPU is lost")
        return self.gpu.sample()


def gated_batcher(
    probe: object, gpu: SimulatedGPU, *, batcher_probe: object = "auto", its_controller: bool = True
) -> tuple[Any, Any]:
    """A batcher behind a gate on one route; a batch of n holds 100 MiB + n * 100 MiB for 10 ms."""
    sizes: list[int] = []

    @batch(max_wait_s=0.02, probe=batcher_probe)  # type: ignore[arg-type]
    def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        with gpu.allocate(100 * MiB * (1 + len(items))):
            time.sleep(0.01)
        return [x + 1 for x in items]

    async def predict(request: Request) -> JSONResponse:
        return JSONResponse({"y": await run(int(request.query_params["x"]))})

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"])])
    controller = run.gate_controller() if its_controller else None
    gate = AdaptiveGate(app, tag=None, probe=probe, controller=controller, max_limit=64)
    run.sizes = sizes  # type: ignore[attr-defined]
    return gate, run


async def post_rounds(client: httpx.AsyncClient, rounds: int, n: int = 32) -> None:
    async def one(x: int, answers: list[int]) -> None:
        response = await client.post(f"/predict?x={x}")
        answers.append(response.json()["y"])

    for _ in range(rounds):
        answers: list[int] = []
        async with anyio.create_task_group() as tg:
            for x in range(n):
                tg.start_soon(one, x, answers)
        assert sorted(answers) == list(range(1, n + 1))


async def test_behind_a_gate_the_batcher_reads_the_card_through_the_gates_sampler() -> None:
    # 2 GiB card, 200 MiB taken: about 16 items fit alone, 6 beside a 1 GiB neighbour.
    gpu = SimulatedGPU(2 * GiB, baseline_bytes=200 * MiB)
    probe = ThreadsThatRead(gpu)
    gate, run = gated_batcher(probe, gpu)
    async with served(gate) as client:
        await post_rounds(client, 8)
        alone = max(run.sizes[-10:])
        gpu.set_neighbour(1 * GiB)
        await post_rounds(client, 4)
        beside = max(run.sizes[-10:])
        why_beside = (await client.get("/gate/status")).json()["controller"]["why"]
        gpu.set_neighbour(0)
        await post_rounds(client, 4)
        after = max(run.sizes[-10:])
        status = (await client.get("/gate/status")).json()
    assert 14 <= alone <= 16 and beside <= 6 and after >= 14
    assert gpu.oom_count == 0  # the gate's reading before each batch saw the neighbour come and go
    stats = run.statistics()
    assert stats.probe == status["controller"]["batching"]["probe"] == "probe: the gate's sampler"
    # One line says why the limit is what it is, with the figures behind it.
    assert why_beside.startswith("batch capacity: twice a batch of ") and "(memory: " in why_beside
    assert "units fit the room under the target; probe: the gate's sampler)" in why_beside
    readers = {ident for name, ident in probe.threads if name == "adaptive-gate-probe"}
    assert len(readers) == 1, "the card was read by a probe thread of the batcher's beside the gate's sampler"
    on_the_sampler = sum(name == "adaptive-gate-probe" for name, _ in probe.threads)
    assert on_the_sampler >= stats.batches  # a reading on the gate's sampler thread before each batch
    assert {name for name, _ in probe.threads} <= {"adaptive-gate-probe", "adaptive-gate-batch-peak"}


async def test_the_batcher_asks_nothing_of_a_failing_gate_probe_while_the_sampler_backs_off() -> None:
    gpu = SimulatedGPU(2 * GiB)
    probe = ThreadsThatRead(gpu, fails=True)
    gate, run = gated_batcher(probe, gpu)
    async with served(gate) as client:
        for x in range(40):  # one batch each
            assert (await client.post(f"/predict?x={x}")).json() == {"y": x + 1}
        status = (await client.get("/gate/status")).json()
    assert run.statistics().batches == 40
    assert status["probe"]["consecutive_errors"] >= 1
    assert len(probe.threads) < 15, f"{len(probe.threads)} readings of a failing probe for 40 batches"


def test_a_batcher_with_a_probe_of_its_own_behind_a_gate_that_reads_another_is_refused() -> None:
    gpu, other = SimulatedGPU(GiB), SimulatedGPU(GiB)
    for gate_probe in (gpu, "auto"):
        with pytest.raises(ValueError, match=r"two views of one card\. Give the probe to the gate alone"):
            gated_batcher(gate_probe, gpu, batcher_probe=other)
    _, same = gated_batcher(gpu, gpu, batcher_probe=gpu)  # the gate's own probe: one view
    assert same.statistics().probe == "probe: the gate's sampler"
    _, told_none = gated_batcher(gpu, gpu, batcher_probe=None)  # as it was told: no readings
    assert told_none.statistics().probe.startswith("probe: none")
    _, alone = gated_batcher(None, gpu, batcher_probe=other)  # the gate reads nothing: the batcher's own
    assert alone.statistics().probe == f"probe: {other!r}"


async def test_a_batcher_behind_a_gate_whose_limit_is_not_its_own_is_a_finding() -> None:
    found: dict[bool, list[dict[str, Any]]] = {}
    for its_controller in (False, True):
        gpu = SimulatedGPU(2 * GiB, baseline_bytes=200 * MiB)
        gate, _ = gated_batcher(gpu, gpu, its_controller=its_controller)
        async with served(gate) as client:
            await post_rounds(client, 2, n=4)
            found[its_controller] = (await client.get("/gate/status")).json()["findings"]
    assert found[True] == []
    [finding] = found[False]
    assert finding["code"] == "batcher_without_its_controller" and finding["active"]
    assert "do not set its limit (run)" in finding["message"]
    assert "controller=run.gate_controller()" in finding["advice"]
    assert finding["appearances"] == 1  # said once, however many items ran


async def test_each_batcher_but_the_one_that_sets_the_limit_is_named_in_the_finding_of_each_gate() -> None:
    def echo(name: str) -> Any:
        def run(items: list[int]) -> list[int]:
            return items

        run.__name__ = name
        return batch(max_wait_s=0.0, probe=None)(run)

    a, b, c = echo("a"), echo("b"), echo("c")

    def gate_in_front(controller: object) -> AdaptiveGate:
        async def call(request: Request) -> JSONResponse:
            batched = {"a": a, "b": b, "c": c}[request.path_params["name"]]
            return JSONResponse({"y": await batched(1)})

        app = Starlette(routes=[Route("/{name}", call, methods=["POST"])])
        return AdaptiveGate(app, tag=None, probe=None, controller=controller, max_limit=64)

    async def findings(gate: AdaptiveGate, names: str) -> list[dict[str, Any]]:
        async with client_for(gate) as client:
            for name in names:
                assert (await client.post(f"/{name}")).json() == {"y": 1}
            return list((await client.get("/gate/status")).json()["findings"])

    assert await findings(gate_in_front(a.gate_controller()), "aaa") == []  # the batcher that sets the limit
    [finding] = await findings(gate_in_front(a.gate_controller()), "abcbca")
    assert "do not set its limit (b, c)" in finding["message"] and finding["appearances"] == 1
    assert "a gate of its own" in finding["advice"]
    [finding] = await findings(gate_in_front(None), "b")  # told to one gate, b is told to the next one too
    assert "do not set its limit (b)" in finding["message"]
    [finding] = await findings(gate_in_front(a.gate_controller()), "ab")  # one other: no advice to swap a out
    assert "the gate's limit is a's capacity" in finding["message"]
    assert (
        "a gate of its own" in finding["advice"]
        and "controller=b.gate_controller() to the gate" not in finding["advice"]
    )


async def test_a_finding_names_each_batched_function_once_however_many_batchers_a_factory_made() -> None:
    def made() -> Any:
        def infer(items: list[int]) -> list[int]:
            return items

        return batch(max_wait_s=0.0, probe=None)(infer)

    batchers = [made() for _ in range(40)]

    async def call(request: Request) -> JSONResponse:
        return JSONResponse({"y": await batchers[int(request.query_params["i"])](1)})

    gate = AdaptiveGate(Starlette(routes=[Route("/", call, methods=["POST"])]), tag=None, probe=None)
    async with client_for(gate) as client:
        for i in range(40):
            assert (await client.post(f"/?i={i}")).json() == {"y": 1}
        [finding] = (await client.get("/gate/status")).json()["findings"]
    assert "do not set its limit (infer):" in finding["message"]


def test_a_peak_watch_closed_while_its_batch_runs_watches_that_batch_to_its_end() -> None:
    """A gate built while a batch runs closes the batcher's own watch: that batch's peak is still wanted."""
    gpu = SimulatedGPU(GiB, baseline_bytes=100 * MiB)
    watch = _batch_probe.PeakWatch(gpu, 0.001)
    watch.begin()
    watch.close()
    with gpu.allocate(300 * MiB):
        time.sleep(0.05)
    assert watch.end() == 400 * MiB
    assert watch._thread is not None
    watch._thread.join(5)
    assert not watch._thread.is_alive()


async def test_a_gate_built_while_the_batcher_starts_its_own_probe_takes_over_cleanly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu, own = SimulatedGPU(2 * GiB), SimulatedGPU(2 * GiB)
    starting, go = threading.Event(), threading.Event()

    def slow_auto_probe() -> tuple[SimulatedGPU, str]:
        starting.set()
        go.wait(30)
        return own, "probe: the batcher's own"

    monkeypatch.setattr(_batch_probe, "auto_probe", slow_auto_probe)
    gate, run = gated_batcher(None, gpu)  # built first without a probe: the batcher reads its own ("auto")
    async with anyio.create_task_group() as tg:
        tg.start_soon(run, 0)
        await anyio.to_thread.run_sync(starting.wait)
        other = AdaptiveGate(gate.app, tag=None, probe=gpu, controller=gate.core.controller, max_limit=64)
        go.set()
    stats = run.statistics()
    assert stats.probe == "probe: the gate's sampler" and stats.probe_errors == 0
    assert run._probe.probe is not own
    del other


async def test_with_every_gate_it_read_through_gone_the_batcher_reads_its_own_probe_again() -> None:
    gpu = SimulatedGPU(2 * GiB, baseline_bytes=200 * MiB)

    async def serve(gate: AdaptiveGate) -> None:
        async with served(gate) as client:
            await post_rounds(client, 1, n=4)

    before = set(threading.enumerate())
    first, run = gated_batcher(gpu, gpu, batcher_probe=gpu)
    await serve(first)
    assert run.statistics().probe == "probe: the gate's sampler"
    controller = first.core.controller
    del first
    for thread in set(threading.enumerate()) - before:  # the gate's sampler thread ends a moment after it
        if thread.name == "adaptive-gate-probe":
            await anyio.to_thread.run_sync(thread.join, 10)  # not on the loop: its last answer goes through it
    gc.collect()
    app = Starlette(routes=[Route("/predict", lambda request: JSONResponse({}), methods=["POST"])])
    AdaptiveGate(app, tag=None, probe=None, controller=controller)  # reads nothing: the batcher its own
    assert await run(1) == 2
    assert run.statistics().probe == f"probe: {gpu!r}"
