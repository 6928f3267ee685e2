"""Helpers for tests, demos and benchmarks without a GPU.

`SimulatedGPU` is a device model: memory that runs out the way a card's does (with an optional
fragmentation penalty), a cumulative OOM count like PyTorch's `num_ooms`, a neighbour process that
can take memory, and a compute model in which throughput saturates at a knee (processor sharing),
so latency grows with concurrency past it. It is also a probe (`sample()`), so the gate can watch it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from ._checks import check_bytes, check_int, check_number, check_real
from .memory import MemorySample

__all__ = ["Allocation", "SimulatedGPU", "SimulatedOutOfMemoryError"]


class SimulatedOutOfMemoryError(RuntimeError):
    """Raised where torch is not installed; `is_oom` accepts it like torch's own."""


def _oom_error(message: str) -> RuntimeError:
    try:
        import torch
    except ImportError:
        return SimulatedOutOfMemoryError(message)
    return torch.cuda.OutOfMemoryError(message)


class Allocation:
    """Memory held on the simulated card until `release()` or the end of a `with` block.

    Dropping the object without releasing it leaks the memory, as a tensor kept alive by a
    forgotten reference would: garbage collection frees nothing here.
    """

    def __init__(self, gpu: SimulatedGPU, nbytes: int) -> None:
        self._gpu = gpu
        self.nbytes = nbytes
        self._held = False

    def __enter__(self) -> Allocation:
        self._gpu._take(self.nbytes)
        self._held = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def release(self) -> None:
        if self._held:
            self._held = False
            self._gpu._give(self.nbytes)


class SimulatedGPU:
    """A thread-safe model of one GPU's memory and compute.

    * `total_bytes`: the card; `baseline_bytes`: taken from the start (weights, CUDA context).
    * `fragmentation`: an allocation may fail up to this fraction of the card below the nominal
      total (drawn per allocation), as fragmented allocators do. 0 means exact.
    * `knee`: how many concurrent `compute()` calls the card runs at full speed; past it they share
      the card's throughput (processor sharing). `math.inf` means no contention.

    `sample()` reads the card as the `torch` probe does: what is used, and this process's own live
    bytes (`allocated_bytes`: the baseline and the allocations, not a neighbour's).
    """

    # The status marks its readings as simulated (a probe of one's own may say so too).
    simulated = True

    def __init__(
        self,
        total_bytes: int,
        *,
        baseline_bytes: int = 0,
        fragmentation: float = 0.0,
        knee: float = math.inf,
        seed: int | None = None,
    ) -> None:
        total_bytes, baseline_bytes = (
            check_bytes("total_bytes", total_bytes),
            check_bytes("baseline_bytes", baseline_bytes),
        )
        if total_bytes == 0:
            raise ValueError("total_bytes must be > 0, got 0")
        if baseline_bytes > total_bytes:
            raise ValueError(f"baseline_bytes must be within [0, total_bytes], got {baseline_bytes}")
        if not 0.0 <= check_real("fragmentation", fragmentation, "a number in [0, 1)") < 1.0:  # NaN too
            raise ValueError(f"fragmentation must be in [0, 1), got {fragmentation}")
        if not check_real("knee", knee, "a number (math.inf: no contention)") > 0:  # NaN too
            raise ValueError(f"knee must be > 0 (math.inf: no contention), got {knee}")
        self.total_bytes = total_bytes
        self.fragmentation = fragmentation
        self.knee = knee
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._used_bytes = baseline_bytes
        self._neighbour_bytes = 0  # what the neighbour holds
        self._neighbour_wanted_bytes = 0  # what it asked for: it takes the rest as memory frees
        self._oom_count = 0
        self._peak_bytes = baseline_bytes
        self._computing = 0

    def __repr__(self) -> str:
        return f"SimulatedGPU(total_bytes={self.total_bytes}, knee={self.knee}, fragmentation={self.fragmentation})"

    # -- memory ---------------------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used_bytes + self._neighbour_bytes

    @property
    def oom_count(self) -> int:
        with self._lock:
            return self._oom_count

    @property
    def peak_bytes(self) -> int:
        with self._lock:
            return self._peak_bytes

    def sample(self) -> MemorySample:
        with self._lock:
            return MemorySample(
                self._used_bytes + self._neighbour_bytes,
                self.total_bytes,
                self._oom_count,
                allocated_bytes=self._used_bytes,  # this process's live bytes: the weights and ours
            )

    def restart(self) -> None:
        """The process that holds the model started afresh (a CUDA error poisoned the old one): its
        allocator's statistics, the OOM count among them, start again from zero."""
        with self._lock:
            self._oom_count = 0

    def allocate(self, nbytes: int) -> Allocation:
        """`with gpu.allocate(n): ...` holds n bytes for the block; raises an OOM if they don't fit."""
        return Allocation(self, check_bytes("nbytes", nbytes))

    def set_neighbour(self, nbytes: int) -> None:
        """Another process on the card now wants `nbytes` (0: it left). It takes what is free now and
        the rest as memory frees, before anyone else (a process that retries its allocation), so the
        card never holds more than it has: a reading shows what is really held."""
        nbytes = check_bytes("nbytes", nbytes)
        with self._lock:
            self._neighbour_wanted_bytes = nbytes
            self._neighbour_bytes = min(self._neighbour_bytes, nbytes)
            self._top_up_neighbour()

    def _top_up_neighbour(self) -> None:
        """Under the lock: the neighbour takes what it still wants of the free memory."""
        free_bytes = self.total_bytes - self._used_bytes - self._neighbour_bytes
        missing_bytes = self._neighbour_wanted_bytes - self._neighbour_bytes
        if missing_bytes > 0 and free_bytes > 0:
            self._neighbour_bytes += min(missing_bytes, free_bytes)
            self._peak_bytes = max(self._peak_bytes, self._used_bytes + self._neighbour_bytes)

    def grow_neighbour(self, step_bytes: int, up_to_bytes: int) -> bool:
        """A greedy neighbour (another process's caching allocator) takes `step_bytes` more while that
        much is free, up to `up_to_bytes` in all; True when it grew."""
        check_int("step_bytes", step_bytes, 1)
        check_int("up_to_bytes", up_to_bytes, 0)
        with self._lock:
            free_bytes = self.total_bytes - self._used_bytes - self._neighbour_bytes
            if free_bytes < step_bytes or self._neighbour_bytes + step_bytes > up_to_bytes:
                return False
            self._neighbour_bytes += step_bytes
            self._neighbour_wanted_bytes = self._neighbour_bytes
            self._peak_bytes = max(self._peak_bytes, self._used_bytes + self._neighbour_bytes)
            return True

    @property
    def neighbour_bytes(self) -> int:
        with self._lock:
            return self._neighbour_bytes

    def _take(self, nbytes: int) -> None:
        with self._lock:
            usable = self.total_bytes
            if self.fragmentation:
                usable -= int(self._random.random() * self.fragmentation * self.total_bytes)
            in_use = self._used_bytes + self._neighbour_bytes
            if in_use + nbytes <= usable:
                self._used_bytes += nbytes
                self._peak_bytes = max(self._peak_bytes, self._used_bytes + self._neighbour_bytes)
                return
            free_bytes = max(0, self.total_bytes - in_use)
        message = (
            f"CUDA out of memory. Tried to allocate {nbytes / 2**20:.2f} MiB. GPU 0 has a total capacity "
            f"of {self.total_bytes / 2**30:.2f} GiB of which {free_bytes / 2**20:.2f} MiB is free. (simulated)"
        )
        # The error first, then the count: the first one imports torch, which can take longer than the gate waits
        # for a raised OOM to explain a rise of the count (then it counted one OOM twice, as the app's own too).
        error = _oom_error(message)
        with self._lock:
            self._oom_count += 1
        raise error

    def _give(self, nbytes: int) -> None:
        with self._lock:
            self._used_bytes -= nbytes
            self._top_up_neighbour()

    # -- compute --------------------------------------------------------------------------------

    def compute(self, work_s: float, *, tick_s: float = 0.002) -> None:
        """Block for `work_s` seconds of full-speed work, slowed down past the knee."""
        check_number("work_s", work_s, finite=True)
        check_number("tick_s", tick_s, allow_zero=False, finite=True)  # a tick of 0 s never ends
        with self._lock:
            self._computing += 1
        try:
            remaining_s = work_s
            while remaining_s > 0:
                with self._lock:
                    speed = min(1.0, self.knee / self._computing)
                step_s = min(tick_s, remaining_s / speed)
                time.sleep(step_s)
                remaining_s -= step_s * speed
        finally:
            with self._lock:
                self._computing -= 1

    @contextmanager
    def holding(self, nbytes: int, work_s: float) -> Iterator[None]:
        """One request's life on the card: allocate, compute, and free on the way out."""
        with self.allocate(nbytes):
            self.compute(work_s)
            yield
