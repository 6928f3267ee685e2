"""The virtual-time driver behind `adaptive_gate.simulate`: an event heap, a simulated card, and
the gate's own core told what happens exactly as the middleware tells it."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .._checks import check_bytes, check_number
from .._gate.core import GateCore, Outcome, Ticket, units_of_cost
from .._gate.limiter import Waiter
from .._gate.reasons import ADMITTED, Reason
from .._gate.statistics import LimitChange
from ..memory import MemorySample
from ..testing import Allocation, SimulatedGPU

__all__ = ["CLIENT_PAUSE_S", "NEIGHBOUR_PERIOD_S", "Phase", "Run", "SimulationResult"]

NEIGHBOUR_PERIOD_S = 0.01  # how often a greedy neighbour looks for free memory
CLIENT_PAUSE_S = 0.01  # a closed-loop client's pause before it asks again after a refusal (a round trip)


@dataclass(frozen=True)
class Phase:
    """From `start_s` on: arrivals per second, bytes and seconds of work per request, a neighbour."""

    start_s: float
    rate_per_s: float  # open loop (ignored where `simulate` is given closed-loop `clients`)
    request_bytes: int | Callable[[random.Random], int]  # a size, or a draw per request (mixed sizes)
    work_s: float | Callable[[random.Random], float]  # seconds of work, or a draw per request (jitter)
    neighbour_bytes: int = 0
    # > 0: a greedy neighbour, which takes this much more every 10 ms while it is free, up to `neighbour_bytes`
    neighbour_step_bytes: int = 0
    # What a request of so many bytes says it weighs (the gate's `cost`); None: every request weighs 1
    cost: Callable[[int], float] | None = None
    # Which route a request of so many bytes takes (one the gate can tell apart); None: one route
    route: Callable[[int], str] | None = None

    def __post_init__(self) -> None:
        """Bad numbers fail here, saying which (a NaN rate drew no arrival and failed deep in the run)."""
        check_number("Phase.start_s", self.start_s, finite=True)
        check_number("Phase.rate_per_s", self.rate_per_s, finite=True)
        if not callable(self.work_s):
            check_number("Phase.work_s (seconds, or a draw (rng) -> seconds)", self.work_s, finite=True)
        # Bytes as `MemorySample` takes them: whole, an integral float taken as an int
        drawn = callable(self.request_bytes)
        for name in ["neighbour_bytes", "neighbour_step_bytes", *([] if drawn else ["request_bytes"])]:
            object.__setattr__(self, name, check_bytes(f"Phase.{name}", getattr(self, name)))
        for name in ("cost", "route"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise TypeError(f"Phase.{name} must be None or a callable of a request's bytes")


@dataclass
class SimulationResult:
    duration_s: float
    completed: int = 0
    ooms: int = 0
    rejected: int = 0
    timed_out: int = 0
    crashed: int = 0  # requests lost to a worker that went down (`crash_s`)
    too_large: int = 0  # of the OOMs, those the gate called too large (no load could have avoided them)
    latencies_s: list[float] = field(default_factory=list)
    oom_times_s: list[float] = field(default_factory=list)
    # With record=True: what the core was told, in order, as (time, event, request id, detail):
    # ("arrive", id, None), ("start", id, "oom" | "ok"), ("oom", id, the bytes it asked for) when it runs out,
    # ("finish", id, None), ("sample", -1, MemorySample)
    events: list[tuple[float, str, int, object]] = field(default_factory=list)
    # (time, old limit, new limit, reason) for every change of the limit
    limit_changes: list[tuple[float, int, int, str]] = field(default_factory=list)
    # (time, limit, in_flight, queued, used_bytes), one row per sample
    series: list[tuple[float, int, float, int, int]] = field(default_factory=list)

    def limits_between(self, start_s: float, end_s: float) -> list[int]:
        return [limit for t, limit, *_ in self.series if start_s <= t < end_s]

    def ooms_between(self, start_s: float, end_s: float) -> int:
        return sum(1 for t in self.oom_times_s if start_s <= t < end_s)

    def goodput_per_s(self) -> float:
        return self.completed / self.duration_s


@dataclass
class _Request:
    id: int
    arrived_s: float
    nbytes: int
    work_s: float
    units: float = 1
    route: str | None = None
    client: int | None = None  # the closed-loop client that sent it
    requests: float = 1  # what it weighs before its route's weight (`GateCore.admitted`)
    heavier: float = 0.0  # of `units`, what it weighs as one from before the sizes shrank (`GateCore.granted`)
    remaining_s: float = 0.0
    doomed: bool = False  # it will run out of memory when its remaining work is done
    ticket: Ticket | None = None
    waiter: Waiter | None = None
    allocation: Allocation | None = None


class Run:
    core: GateCore
    oom_after_fraction = 0.0
    crash_s = 0.0
    start_delay_s = 0.0  # the most an admitted request waits before it allocates (`simulate`)
    clients: int | None = None
    down_until_s = -math.inf

    def __init__(
        self,
        phases: list[Phase],
        total_bytes: int,
        baseline_bytes: int,
        duration_s: float,
        queue_timeout_s: float,
        knee: float,
        sample_period_s: float,
        seed: int,
        record: bool,
    ) -> None:
        self.phases = sorted(phases, key=lambda p: p.start_s)  # in any order, as their start says
        if not self.phases or self.phases[0].start_s != 0:
            raise ValueError("phases must start with one at start_s=0")
        self.gpu = SimulatedGPU(total_bytes, baseline_bytes=baseline_bytes)
        self.now_s = 0.0
        self.queue_timeout_s = queue_timeout_s
        self.knee = knee
        self.sample_period_s = sample_period_s
        self.random = random.Random(seed)
        self.result = SimulationResult(duration_s)
        self.record = record
        self.events: list[tuple[float, int, str, object]] = []
        self.sequence = itertools.count()
        self.ids = itertools.count()
        self.running: list[_Request] = []
        self.starting: list[_Request] = []  # admitted, and yet to allocate (`start_delay_s`)
        self.waiting: dict[Waiter, _Request] = {}
        self.next_completion: tuple[float, _Request] | None = None

    def schedule(self, at_s: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (at_s, next(self.sequence), kind, payload))

    def told(self, event: str, request_id: int, detail: object = None) -> None:
        if self.record:
            self.result.events.append((self.now_s, event, request_id, detail))

    def limit_changed(self, change: LimitChange) -> None:
        self.result.limit_changes.append((self.now_s, change.old, change.new, change.reason))

    def phase(self) -> Phase:
        return [p for p in self.phases if p.start_s <= self.now_s][-1]

    def run(self) -> SimulationResult:
        self.schedule(0.0, "sample")  # the sampler starts with the service, before the first request
        if self.clients is None:
            self.schedule(0.0, "arrival")
        else:
            for client in range(self.clients):
                self.schedule(client * CLIENT_PAUSE_S / self.clients, "arrival", client)
        for phase in self.phases:
            self.schedule(phase.start_s, "phase", phase)
        handlers: dict[str, Callable[[object], None]] = {
            "arrival": self.on_arrival,
            "sample": self.on_sample,
            "phase": self.on_phase,
            "deadline": self.on_deadline,
            "completion": self.on_completion,
            "neighbour": self.on_neighbour,
            "allocate": self.on_allocate,
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
        if payload.neighbour_step_bytes:
            self.on_neighbour(payload)
        else:
            self.gpu.set_neighbour(payload.neighbour_bytes)
        self.core.tick(self.now_s)  # the card changed: a controller that knows the future acts now

    def on_neighbour(self, payload: object) -> None:
        assert isinstance(payload, Phase)
        if self.phase() is not payload:
            return  # the greedy neighbour's phase is over
        self.gpu.grow_neighbour(payload.neighbour_step_bytes, payload.neighbour_bytes)
        self.schedule(self.now_s + NEIGHBOUR_PERIOD_S, "neighbour", payload)

    def on_arrival(self, client: object) -> None:
        phase = self.phase()
        if client is None:  # open loop: the next arrival is drawn now
            if phase.rate_per_s <= 0:
                self.schedule(self.now_s + 0.1, "arrival")
                return
            self.schedule(self.now_s + self.random.expovariate(phase.rate_per_s), "arrival")
        assert client is None or isinstance(client, int)
        nbytes = phase.request_bytes
        if not isinstance(nbytes, int):  # a draw: checked as each comes (a NaN of work ran as none)
            nbytes = check_bytes("Phase.request_bytes's draw", nbytes(self.random))
        work_s = phase.work_s
        if not isinstance(work_s, int | float):
            work_s = check_number("Phase.work_s's draw (seconds)", work_s(self.random), finite=True)
        route = None if phase.route is None else phase.route(nbytes)
        # What it weighs before its route's weight
        requests = 1 if phase.cost is None else self.core.shaped(units_of_cost(phase.cost(nbytes)))
        units = self.core.weigh(route, requests)
        request = _Request(next(self.ids), self.now_s, nbytes, work_s, units, route, client, requests=requests)
        self.told("arrive", request.id)
        admission = self.core.arrive(self.queue_timeout_s, now_s=self.now_s, units=units, route=route)
        if admission is ADMITTED:
            self.start(request)
        elif isinstance(admission, Reason):
            self.core.rejected(admission, now_s=self.now_s)
            self.result.rejected += 1
            self.answered(request, refused=True)
        else:
            request.waiter = admission
            self.waiting[admission] = request
            self.schedule(self.now_s + self.queue_timeout_s, "deadline", request)
            self.start_granted()

    def answered(self, request: _Request, *, refused: bool = False) -> None:
        """A closed-loop client has its answer: it sends its next request."""
        if request.client is not None:
            self.schedule(self.now_s + (CLIENT_PAUSE_S if refused else 0.0), "arrival", request.client)

    def start(self, request: _Request) -> None:
        request.ticket = self.core.admitted(
            self.now_s, self.now_s - request.arrived_s, request.units, request.route, request.requests, request.heavier
        )
        if self.start_delay_s > 0:
            # Admitted, and holding nothing until its handler runs: a loaded event loop, a decode on the CPU
            self.schedule(self.now_s + self.random.uniform(0.0, self.start_delay_s), "allocate", request)
            self.starting.append(request)
            return
        self.on_allocate(request)

    def on_allocate(self, payload: object) -> None:
        request = payload
        assert isinstance(request, _Request) and request.ticket is not None
        if request.ticket.released:
            return  # lost with the worker while it waited to start
        if self.start_delay_s > 0:
            self.starting.remove(request)
        if self.now_s < self.down_until_s:
            self.crashed(request)  # the worker is restarting: whatever it is sent fails
            return
        try:
            request.allocation = self.gpu.allocate(request.nbytes).__enter__()
        except RuntimeError:
            self.told("start", request.id, "oom")
            if self.oom_after_fraction <= 0:
                self.out_of_memory(request)
                return
            request.doomed = True  # it computes part of its way before it runs out, as a forward pass does
            request.remaining_s = self.oom_after_fraction * request.work_s
            self.running.append(request)
            return
        self.told("start", request.id, "ok")
        request.remaining_s = request.work_s
        self.running.append(request)

    def out_of_memory(self, request: _Request) -> None:
        assert request.ticket is not None
        self.told("oom", request.id, request.nbytes)
        self.result.ooms += 1
        self.result.rejected += 1
        self.result.oom_times_s.append(self.now_s)
        # The error names the allocation that failed, as torch's does ("Tried to allocate ..."):
        # the middleware reads it from the message (`oom.tried_bytes`), here it is the request's size.
        too_large = self.core.oom(request.ticket, self.now_s, tried_bytes=request.nbytes)
        self.core.release(request.ticket, self.now_s, Outcome.OOM)
        self.core.rejected(Reason.TOO_LARGE if too_large else Reason.OOM, now_s=self.now_s)
        self.result.too_large += too_large
        self.answered(request, refused=True)
        if self.crash_s > 0 and self.now_s >= self.down_until_s:
            self.down_until_s = self.now_s + self.crash_s
            self.next_completion = None
            self.gpu.restart()  # a new process: the probe's OOM count starts again
            for running in list(self.running):
                self.running.remove(running)
                self.crashed(running)
            for starting in self.starting:  # admitted and yet to allocate: lost with the process too
                self.crashed(starting)
            self.starting.clear()
        self.start_granted()

    def crashed(self, request: _Request) -> None:
        """Lost with the worker: its memory is freed with the process, and the gate sees a failure."""
        assert request.ticket is not None
        if request.allocation is not None:
            request.allocation.release()
            request.allocation = None
        self.result.crashed += 1
        self.core.release(request.ticket, self.now_s, Outcome.FAILED)
        self.answered(request, refused=True)

    def on_completion(self, payload: object) -> None:
        assert isinstance(payload, _Request)
        if self.next_completion is None or self.next_completion[1] is not payload or payload.remaining_s > 1e-9:
            return  # a stale event: the request finished already, or others slowed it down
        self.next_completion = None
        self.running.remove(payload)
        if payload.doomed:
            self.out_of_memory(payload)
            return
        if payload.allocation is not None:
            payload.allocation.release()
        self.told("finish", payload.id)
        self.result.completed += 1
        self.result.latencies_s.append(self.now_s - payload.arrived_s)
        assert payload.ticket is not None
        self.core.release(payload.ticket, self.now_s, Outcome.COMPLETED)
        self.answered(payload)
        self.start_granted()

    def on_deadline(self, payload: object) -> None:
        assert isinstance(payload, _Request)
        waiter = payload.waiter
        if waiter is None or waiter not in self.waiting:
            return
        del self.waiting[waiter]
        self.core.leave(waiter, self.now_s)
        self.core.rejected(Reason.DEADLINE, now_s=self.now_s, timed_out=True)
        self.result.timed_out += 1
        self.result.rejected += 1
        self.answered(payload, refused=True)
        self.start_granted()

    def on_sample(self, _: object) -> None:
        sample: MemorySample = self.gpu.sample()
        self.told("sample", -1, sample)
        self.core.sample(sample, self.now_s)
        limiter = self.core.limiter
        self.result.series.append(
            (round(self.now_s, 3), limiter.limit, limiter.in_flight, limiter.queued, sample.used_bytes)
        )
        self.start_granted()
        self.schedule(self.now_s + self.sample_period_s, "sample")

    def start_granted(self) -> None:
        """Start the waiters the core handed a slot to, in the order they queued."""
        while True:
            waiter = next((w for w in self.waiting if w.granted), None)
            if waiter is None:
                return
            request = self.waiting.pop(waiter)
            request.units, request.heavier = self.core.granted(waiter)
            self.start(request)
