"""What a benchmark scenario is: phases of request sizes and a neighbour on a simulated card."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["INFER_PATHS", "GiB", "Phase", "Scenario", "Size"]

GiB = 2**30
INFER_PATHS = ("/infer", "/infer/large")  # the benchmark app's gated routes (the second: mixed-routes)


@dataclass(frozen=True)
class Size:
    """Every request takes `nbytes`: the oracle can tell how many fit."""

    nbytes: int

    def __call__(self, _: random.Random) -> int:
        return self.nbytes


@dataclass(frozen=True)
class Phase:
    """From `at_fraction` of the run on: request sizes and the neighbour's bytes."""

    at_fraction: float
    request_bytes: Callable[[random.Random], int]
    neighbour_bytes: int = 0
    # > 0: a greedy neighbour that takes this much more whenever it is free, up to `neighbour_bytes`
    neighbour_step_bytes: int = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    phases: list[Phase]
    total_bytes: int = 24 * GiB
    weights_bytes: int = 8 * GiB
    work_s: float = 0.1
    knee: float = 6.0
    capacity_per_s: float = 50.0  # what fits at once on the nominal card, over work_s
    # > 0: an OOM takes the worker down for so long (a CUDA error that poisons the context)
    crash_s: float = 0.0
    # True: each request's work is drawn around `work_s` (noise that does not depend on concurrency)
    jitter: bool = False
    # An allocation may fail up to this share of the card below the nominal total (a fragmented
    # allocator, a peak the readings miss): what the readings show fits, now and then does not
    fragmentation: float = 0.0
    cost: Callable[[int], float] | None = None  # what a request of so many bytes says it weighs
    route: Callable[[int], str] | None = None  # the path a request of so many bytes takes (None: /infer)
    lifespan: bool = True  # False: served without a lifespan (the gate starts its work on the first request)
    sample_period_s: float = 0.1  # how often the gate, and the reader, read the card (`sample_period`)
    # > 0: each request allocates up to so long after its admission (a loaded event loop, a CPU decode)
    start_delay_s: float = 0.0

    def work(self, rng: random.Random) -> float:
        """One request's seconds of work: `work_s`, or with jitter a draw from half of it up, with
        `work_s` as the mean (a pause of the event loop, a slow input: more at once is no slower)."""
        return self.work_s * (0.5 + rng.expovariate(2.0)) if self.jitter else self.work_s
