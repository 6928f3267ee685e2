"""SimulatedGPU: memory that runs out like a card's, thread-safe, with a compute knee."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from adaptive_gate import MemorySample, is_oom
from adaptive_gate.testing import SimulatedGPU

GiB = 2**30


def test_allocations_fit_then_oom_and_are_counted() -> None:
    gpu = SimulatedGPU(24 * GiB, baseline_bytes=8 * GiB)
    with gpu.allocate(3 * GiB), gpu.allocate(3 * GiB):
        assert gpu.sample() == MemorySample(14 * GiB, 24 * GiB, 0)
        with pytest.raises(torch.cuda.OutOfMemoryError) as raised, gpu.allocate(11 * GiB):
            pass
        assert is_oom(raised.value)
    assert gpu.used_bytes == 8 * GiB and gpu.oom_count == 1


def test_exact_fit_is_not_an_oom() -> None:
    gpu = SimulatedGPU(4 * GiB, baseline_bytes=1 * GiB)
    with gpu.allocate(3 * GiB):
        assert gpu.used_bytes == gpu.total_bytes
    assert gpu.oom_count == 0


def test_memory_is_freed_on_exceptions_but_not_by_garbage_collection() -> None:
    gpu = SimulatedGPU(8 * GiB)
    with pytest.raises(ValueError), gpu.allocate(2 * GiB):
        raise ValueError("route failed")
    assert gpu.used_bytes == 0
    leaked = gpu.allocate(1 * GiB)
    leaked.__enter__()
    del leaked
    gc.collect()
    assert gpu.used_bytes == 1 * GiB  # a forgotten reference is a leak, as on a real card


def test_neighbour_takes_memory() -> None:
    gpu = SimulatedGPU(10 * GiB)
    gpu.set_neighbour(8 * GiB)
    with pytest.raises(RuntimeError), gpu.allocate(3 * GiB):
        pass
    gpu.set_neighbour(0)
    with gpu.allocate(3 * GiB):
        pass
    assert gpu.oom_count == 1


def test_a_neighbour_takes_what_is_free_and_the_rest_as_it_frees() -> None:
    gpu = SimulatedGPU(10 * GiB, baseline_bytes=2 * GiB)
    held = gpu.allocate(6 * GiB).__enter__()
    gpu.set_neighbour(4 * GiB)  # only 2 GiB are free: it holds those, and the reading shows them
    assert gpu.neighbour_bytes == 2 * GiB and gpu.sample().used_bytes == 10 * GiB
    held.release()  # it takes the rest before anyone else
    assert gpu.neighbour_bytes == 4 * GiB and gpu.sample().used_bytes == 6 * GiB
    gpu.set_neighbour(1 * GiB)
    assert gpu.neighbour_bytes == 1 * GiB and gpu.used_bytes == 3 * GiB


def test_fragmentation_fails_below_the_nominal_total() -> None:
    gpu = SimulatedGPU(10 * GiB, fragmentation=0.2, seed=1)
    failures = 0
    for _ in range(200):
        try:
            with gpu.allocate(int(9.5 * GiB)):
                pass
        except RuntimeError:
            failures += 1
    assert 0 < failures < 200


def test_thread_safe_accounting() -> None:
    gpu = SimulatedGPU(1000 * GiB)

    def churn() -> None:
        for _ in range(2000):
            with gpu.allocate(GiB):
                pass

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gpu.used_bytes == 0 and gpu.peak_bytes <= 8 * GiB


def test_compute_slows_past_the_knee() -> None:
    gpu = SimulatedGPU(GiB, knee=1)

    def timed(n: int) -> float:
        threads = [threading.Thread(target=gpu.compute, args=(0.05,)) for _ in range(n)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - started

    # Four jobs on a knee of one share the card: about four times as long as one (loose bounds).
    assert timed(4) > 2.5 * timed(1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"total_bytes": 0}, "total_bytes"),
        ({"total_bytes": 10, "baseline_bytes": 11}, "baseline_bytes"),
        ({"total_bytes": 10, "fragmentation": 1.0}, "fragmentation"),
        ({"total_bytes": 10, "knee": 0}, "knee"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimulatedGPU(**kwargs)  # type: ignore[arg-type]
