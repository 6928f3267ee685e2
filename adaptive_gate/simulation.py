"""A deterministic replay of the gate on virtual time: controller, limiter, simulated card, arrivals.

No real sleep happens here: an hour of traffic replays in well under a second, and the same seed
gives the same run. This is the controller's regression suite (the scenario tests assert ranges on
its output) and a quick way to try controller settings against a card before deploying them.

The model: requests arrive as a Poisson process per `Phase`; a request takes a slot from the real
`Limiter` (or waits, with a deadline), allocates its bytes on a `SimulatedGPU` when admitted (an
out-of-memory error fails it at once and is reported to the controller), then computes for
`work_s` under processor sharing past the card's `knee`. A sampler reads the card every
`sample_period_s`. Everything the middleware reports to the controller is reported the same way.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .control import AIMD, Controller
from .limiter import Limiter, QueueFull, Waiter
from .testing import Allocation, SimulatedGPU

__all__ = ["Phase", "SimulationResult", "simulate"]


@dataclass(frozen=True)
class Phase:
    """From `start_s` on: arrivals per second, bytes and seconds of work per request, a neighbour."""

    start_s: float
    rate_per_s: float
    request_bytes: int | Callable[[random.Random], int]  # a size, or a draw per request (mixed sizes)
    work_s: float
    neighbour_bytes: int = 0


@dataclass
class SimulationResult:
    duration_s: float
    completed: int = 0
    ooms: int = 0
    rejected: int = 0
    timed_out: int = 0
    latencies_s: list[float] = field(default_factory=list)
    oom_times_s: list[float] = field(default_factory=list)
    # (time, limit, in_flight, queued, used_bytes), one row per sample
    series: list[tuple[float, int, int, int, int]] = field(default_factory=list)

    def limits_between(self, start_s: float, end_s: float) -> list[int]:
        return [limit for t, limit, *_ in self.series if start_s <= t < end_s]

    def ooms_between(self, start_s: float, end_s: float) -> int:
        return sum(1 for t in self.oom_times_s if start_s <= t < end_s)

    def goodput_per_s(self) -> float:
        return self.completed / self.duration_s


@dataclass
class _Request:
    arrived_s: float
    nbytes: int
    work_s: float
    remaining_s: float = 0.0
    admitted_s: float = 0.0
    busy_area_at_admission: float = 0.0
    epoch: int = 0
    waiter: Waiter | None = None
    allocation: Allocation | None = None


def simulate(
    phases: list[Phase],
    *,
    total_bytes: int,
    baseline_bytes: int,
    duration_s: float,
    controller: Controller | None = None,
    min_limit: int = 1,
    max_limit: int = 64,
    initial_limit: int | None = None,
    max_queue: int = 128,
    queue_timeout_s: float = 30.0,
    knee: float = math.inf,
    sample_period_s: float = 0.1,
    seed: int = 0,
) -> SimulationResult:
    controller = controller or AIMD()
    controller.bind(min_limit=min_limit, max_limit=max_limit, initial_limit=initial_limit)
    return _Run(phases, total_bytes, baseline_bytes, duration_s, controller, max_queue, queue_timeout_s, knee,
                sample_period_s, seed).run()  # fmt: skip


class _Run:
    def __init__(
        self,
        phases: list[Phase],
        total_bytes: int,
        baseline_bytes: int,
        duration_s: float,
        controller: Controller,
        max_queue: int,
        queue_timeout_s: float,
        knee: float,
        sample_period_s: float,
        seed: int,
    ) -> None:
        if not phases or phases[0].start_s != 0:
            raise ValueError("phases must start with one at start_s=0")
        self.phases = sorted(phases, key=lambda p: p.start_s)
        self.gpu = SimulatedGPU(total_bytes, baseline_bytes=baseline_bytes)
        self.controller = controller
        self.now_s = 0.0
        self.limiter = Limiter(controller.limit, max_queue=max_queue, clock=lambda: self.now_s)
        self.queue_timeout_s = queue_timeout_s
        self.knee = knee
        self.sample_period_s = sample_period_s
        self.random = random.Random(seed)
        self.result = SimulationResult(duration_s)
        self.events: list[tuple[float, int, str, object]] = []
        self.sequence = itertools.count()
        self.running: list[_Request] = []
        self.waiting: dict[Waiter, _Request] = {}
        self.next_completion: tuple[float, _Request] | None = None

    def schedule(self, at_s: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (at_s, next(self.sequence), kind, payload))

    def phase(self) -> Phase:
        return [p for p in self.phases if p.start_s <= self.now_s][-1]

    def run(self) -> SimulationResult:
        self.schedule(0.0, "sample")  # the sampler starts with the service, before the first request
        self.schedule(0.0, "arrival")
        for phase in self.phases:
            self.schedule(phase.start_s, "phase", phase)
        handlers: dict[str, Callable[[object], None]] = {
            "arrival": self.on_arrival,
            "sample": self.on_sample,
            "phase": self.on_phase,
            "deadline": self.on_deadline,
            "completion": self.on_completion,
        }
        while self.events:
            at_s, _, kind, payload = heapq.heappop(self.events)
            if at_s > self.result.duration_s:
                break
            self.advance(at_s)
            handlers[kind](payload)
            self.reschedule_completion()
        return self.result

    # -- processor sharing --------------------------------------------------------------------

    def speed(self) -> float:
        return min(1.0, self.knee / len(self.running)) if self.running else 1.0

    def advance(self, to_s: float) -> None:
        progress_s = (to_s - self.now_s) * self.speed()
        for request in self.running:
            request.remaining_s -= progress_s
        self.now_s = to_s

    def reschedule_completion(self) -> None:
        """Keep exactly one live completion event: for the request that will finish first."""
        if not self.running:
            return
        first = min(self.running, key=lambda r: r.remaining_s)
        at_s = self.now_s + max(0.0, first.remaining_s) / self.speed()
        if self.next_completion == (at_s, first):
            return
        self.next_completion = (at_s, first)
        self.schedule(at_s, "completion", first)

    # -- events ---------------------------------------------------------------------------------

    def on_phase(self, payload: object) -> None:
        assert isinstance(payload, Phase)
        self.gpu.set_neighbour(payload.neighbour_bytes)

    def on_arrival(self, _: object) -> None:
        phase = self.phase()
        if phase.rate_per_s > 0:
            self.schedule(self.now_s + self.random.expovariate(phase.rate_per_s), "arrival")
            nbytes = phase.request_bytes if isinstance(phase.request_bytes, int) else phase.request_bytes(self.random)
            request = _Request(self.now_s, nbytes, phase.work_s)
            self.admit_or_queue(request)
        else:
            self.schedule(self.now_s + 0.1, "arrival")

    def admit_or_queue(self, request: _Request) -> None:
        if self.limiter.try_acquire():
            self.start(request)
            return
        try:
            waiter = self.limiter.join()
        except QueueFull:
            self.result.rejected += 1
            return
        request.waiter = waiter
        self.waiting[waiter] = request
        self.schedule(self.now_s + self.queue_timeout_s, "deadline", request)

    def start(self, request: _Request) -> None:
        request.admitted_s = self.now_s
        request.busy_area_at_admission = self.limiter.busy_area()
        request.epoch = self.controller.epoch
        try:
            request.allocation = self.gpu.allocate(request.nbytes).__enter__()
        except RuntimeError:
            self.result.ooms += 1
            self.result.rejected += 1
            self.result.oom_times_s.append(self.now_s)
            self.controller.on_oom(now_s=self.now_s, epoch=request.epoch, in_flight=self.limiter.in_flight)
            self.release()
            return
        request.remaining_s = request.work_s
        self.running.append(request)

    def on_completion(self, payload: object) -> None:
        assert isinstance(payload, _Request)
        if self.next_completion is None or self.next_completion[1] is not payload or payload.remaining_s > 1e-9:
            return  # a stale event: the request finished already, or others slowed it down
        self.next_completion = None
        self.running.remove(payload)
        if payload.allocation is not None:
            payload.allocation.release()
        in_flight = self.limiter.in_flight
        latency_s = self.now_s - payload.admitted_s
        concurrency = (self.limiter.busy_area() - payload.busy_area_at_admission) / latency_s
        self.result.completed += 1
        self.result.latencies_s.append(self.now_s - payload.arrived_s)
        demand = self.limiter.queued > 0 or in_flight >= self.limiter.limit
        self.controller.on_success(now_s=self.now_s, latency_s=latency_s, concurrency=concurrency, demand=demand)
        self.release()

    def on_deadline(self, payload: object) -> None:
        assert isinstance(payload, _Request)
        waiter = payload.waiter
        if waiter is None or waiter not in self.waiting:
            return
        del self.waiting[waiter]
        self.limiter.leave(waiter)
        self.result.timed_out += 1
        self.result.rejected += 1
        self.start_granted()

    def on_sample(self, _: object) -> None:
        sample = self.gpu.sample()
        self.controller.on_sample(now_s=self.now_s, sample=sample, in_flight=self.limiter.in_flight)
        self.apply_limit()
        self.result.series.append(
            (round(self.now_s, 3), self.limiter.limit, self.limiter.in_flight, self.limiter.queued, sample.used_bytes)
        )
        self.schedule(self.now_s + self.sample_period_s, "sample")

    # -- the limiter ----------------------------------------------------------------------------

    def release(self) -> None:
        self.limiter.release()
        self.apply_limit()
        self.start_granted()

    def apply_limit(self) -> None:
        if self.controller.limit != self.limiter.limit:
            self.limiter.limit = self.controller.limit
            self.start_granted()

    def start_granted(self) -> None:
        while True:
            waiter = next((w for w in self.waiting if w.granted), None)
            if waiter is None:
                return
            self.start(self.waiting.pop(waiter))
