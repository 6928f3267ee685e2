"""`adaptive_gate._batch.probe`: the batcher's probe, resolved once there is an answer, and its threads
ended with the batched function."""

from __future__ import annotations

import gc
import threading

import anyio
import pytest

from adaptive_gate import batch
from adaptive_gate._batch import probe as _batch_probe
from adaptive_gate.testing import SimulatedGPU

pytestmark = pytest.mark.anyio

GiB = 2**30
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
