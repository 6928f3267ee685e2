"""SimulatedGPU: memory that runs out like a card's, thread-safe, with a compute knee."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from adaptive_gate import MemorySample, is_oom
from adaptive_gate.testing import SimulatedGPU

GiB = 2**30


def test_allocations_fit_then_oom_and_are_counted() -> None:
    gpu = SimulatedGPU(24 * GiB, baseline_bytes=8 * GiB)
    with gpu.allocate(3 * GiB), gpu.allocate(3 * GiB):
        assert gpu.sample() == MemorySample(14 * GiB, 24 * GiB, 0, allocated_bytes=14 * GiB)
        gpu.set_neighbour(2 * GiB)  # another process's bytes are on the card, not in this process's count
        assert gpu.sample() == MemorySample(16 * GiB, 24 * GiB, 0, allocated_bytes=14 * GiB)
        gpu.set_neighbour(0)
        with pytest.raises(torch.cuda.OutOfMemoryError) as raised, gpu.allocate(11 * GiB):
            pass
        assert is_oom(raised.value)
    assert gpu.used_bytes == 8 * GiB and gpu.oom_count == 1


def test_the_count_moves_once_the_error_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """The error is made before the OOM is counted: the first one imports torch, which took 1.5 s, longer than
    the gate waits for a raised OOM to explain a rise of the count, and a reading taken meanwhile counted the
    one OOM twice (as the app's own, and as the route's)."""
    import adaptive_gate.testing as simulated

    gpu = SimulatedGPU(4 * GiB, baseline_bytes=1 * GiB)
    counts_while_made: list[int | None] = []
    make = simulated._oom_error

    def slow_import(message: str) -> RuntimeError:
        counts_while_made.append(gpu.sample().oom_count)  # a reading while torch imports
        return make(message)

    monkeypatch.setattr(simulated, "_oom_error", slow_import)
    with pytest.raises(torch.cuda.OutOfMemoryError), gpu.allocate(4 * GiB):
        pass
    assert counts_while_made == [0] and gpu.oom_count == 1


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


class VirtualTime:
    """A clock for threads that sleep on it: it moves on only when every thread taking part is
    asleep (or done), to the earliest wake-up. How long work took is then the model's figure,
    whatever the machine's speed and however the threads are scheduled."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self._changed = threading.Condition()
        self._awake = 0
        self._wakeups: list[float] = []

    def sleep(self, duration_s: float) -> None:
        with self._changed:
            wake_s = self.now_s + duration_s
            self._wakeups.append(wake_s)
            self._awake -= 1
            self._advance()
            while self.now_s < wake_s:
                self._changed.wait()

    def run(self, target: Callable[[], None], threads: int) -> float:
        """Run `target` in `threads` threads at once; the virtual seconds until the last one ends."""

        def one() -> None:
            try:
                target()
            finally:
                with self._changed:
                    self._awake -= 1
                    self._advance()

        started_s = self.now_s
        self._awake = threads  # the clock waits for all of them, however late a thread starts
        workers = [threading.Thread(target=one) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=30)  # a guard against a hang, not a bound on the work
            assert not t.is_alive()
        return self.now_s - started_s

    def _advance(self) -> None:
        if self._awake == 0 and self._wakeups:
            self.now_s = min(self._wakeups)
            woken = [w for w in self._wakeups if w <= self.now_s]
            self._wakeups = [w for w in self._wakeups if w > self.now_s]
            self._awake += len(woken)
            self._changed.notify_all()


def test_compute_slows_past_the_knee(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = SimulatedGPU(GiB, knee=1)
    clock = VirtualTime()
    monkeypatch.setattr("adaptive_gate.testing.time", SimpleNamespace(sleep=clock.sleep))

    alone_s = clock.run(lambda: gpu.compute(0.05), threads=1)
    shared_s = clock.run(lambda: gpu.compute(0.05), threads=4)
    assert alone_s == pytest.approx(0.05)
    # Four jobs on a knee of one share the card: four times as long as one (less the first tick of
    # those that started before the others had joined).
    assert shared_s == pytest.approx(4 * 0.05, rel=0.05)
    roomy = SimulatedGPU(GiB, knee=4)
    assert clock.run(lambda: roomy.compute(0.05), threads=4) == pytest.approx(0.05)  # up to the knee: full speed


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"total_bytes": 0}, "total_bytes"),
        ({"total_bytes": 10, "baseline_bytes": 11}, "baseline_bytes"),
        ({"total_bytes": 10, "fragmentation": 1.0}, "fragmentation"),
        ({"total_bytes": 10, "knee": 0}, "knee"),
        ({"total_bytes": 10, "knee": float("nan")}, "knee must be > 0"),
        ({"total_bytes": 10.5}, "total_bytes must be a whole number"),
        ({"total_bytes": -1}, "total_bytes must be in"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimulatedGPU(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fragmentation": "0.1"}, r"fragmentation must be a number in \[0, 1\), got str"),  # was: '<=' not supported
        ({"knee": None}, r"knee must be a number \(math.inf: no contention\), got NoneType"),
    ],
)
def test_arguments_of_the_wrong_type(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        SimulatedGPU(GiB, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda gpu: gpu.allocate(1.5), "nbytes must be a whole number"),
        (lambda gpu: gpu.allocate(-1), "nbytes must be in"),
        (lambda gpu: gpu.set_neighbour(float("nan")), "nbytes must be a whole number"),
        (lambda gpu: gpu.grow_neighbour(0, GiB), "step_bytes must be >= 1"),
        (lambda gpu: gpu.compute(-1.0), "work_s must be a finite number >= 0"),
        (lambda gpu: gpu.compute(float("nan")), "work_s must be a finite number >= 0"),
        (lambda gpu: gpu.compute(0.01, tick_s=0), "tick_s must be a finite number > 0"),  # it never ended
    ],
)
def test_bad_calls_say_what_is_wrong(call: Callable[[SimulatedGPU], object], match: str) -> None:
    gpu = SimulatedGPU(GiB)
    with pytest.raises(ValueError, match=match):
        call(gpu)
    assert gpu.used_bytes == 0 and gpu.neighbour_bytes == 0


def test_a_whole_number_of_bytes_given_as_a_float_is_taken() -> None:
    gpu = SimulatedGPU(float(GiB), baseline_bytes=0.0)  # type: ignore[arg-type]
    with gpu.allocate(0.5 * GiB):  # type: ignore[arg-type]
        assert gpu.used_bytes == GiB // 2 and isinstance(gpu.used_bytes, int)
    assert gpu.sample().used_bytes == 0
