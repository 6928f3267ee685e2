"""Sustained overload on virtual time: goodput, fresh answers, and fair shares.

    python -m benchmarks.overload [--duration-s S] [--seed N] [--json PATH]

The gate's own core (`GateCore`, as the middleware drives it) in front of a card that serves
`LIMIT` requests at once, each taking `SERVICE_S` (+-20%, uniform): capacity is LIMIT / SERVICE_S
requests per second. Clients arrive as Poisson flows and carry a deadline (what
`x-envoy-expected-rq-timeout-ms` tells the gate); an answer after it is waste (a late 200).
No real sleep: a minute of traffic replays in a second or so, and a seed gives the same run.

Tables:
- overload: all clients alike at 2x and 4x capacity, for each `overload` mode (lifo, shed, off):
  goodput (answers within the deadline per second, against capacity), the p99 of the successes'
  latency against the deadline, late answers (must be 0);
- closed loop: 8, 24 and 128 clients, each sending its next request when answered (a 60 s
  deadline), for each mode: every request answered 200, and the queue never in overload;
- tenants: a heavy tenant at 10x a light one's rate, 2x capacity in all: the share of its offered
  rate that each gets answered in time (the light one must get >= 90%);
- priorities: a tenth of a 4x load at priority 1: its share answered in time and its wait for a
  slot (a service time is 50 ms).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from adaptive_gate.control import Fixed
from adaptive_gate.core import ADMITTED, GateCore, Outcome, Reason, Ticket
from adaptive_gate.limiter import Waiter
from adaptive_gate.status import percentiles_ms

from .environment import environment

LIMIT = 4
SERVICE_S = 0.05  # capacity: 80/s
DEADLINE_S = 1.0
ROUTE = "/predict"


@dataclass(frozen=True)
class Flow:
    """A Poisson flow of requests alike."""

    rate_per_s: float
    deadline_s: float = DEADLINE_S
    priority: int = 0
    tenant: str | None = None
    # A closed loop instead: this many clients, each sending its next request when the last is
    # answered (after `pause_s` where it was turned away); `rate_per_s` is then not used.
    clients: int | None = None
    pause_s: float = 0.0
    units: float = 1.0  # the slots each request takes (the gate's `cost`, in 64ths)


@dataclass
class FlowResult:
    offered: int = 0
    on_time: int = 0
    late: int = 0
    rejected: int = 0
    rejected_after_s: float = 0.0  # summed: how long the turned away waited for their 503
    latencies_s: list[float] = field(default_factory=list)
    waits_s: list[float] = field(default_factory=list)


@dataclass
class _Request:
    flow: int
    arrived_s: float
    service_s: float
    waiter: Waiter | None = None
    ticket: Ticket | None = None


class Replay:
    """Flows through one `GateCore` on virtual time; `run()` gives a `FlowResult` per flow."""

    def __init__(self, flows: list[Flow], *, overload: str = "lifo", seed: int = 0, max_queue: int = 1024,
                 limit: int = LIMIT, service_s: float = SERVICE_S, classes: bool | None = None,
                 priority_aging_s: float = 10.0) -> None:  # fmt: skip
        self.flows = flows
        self.now_s = 0.0
        self.random = random.Random(seed)
        self.service_s = service_s
        self.core = GateCore(
            Fixed(limit), min_limit=1, max_limit=limit, initial_limit=limit, max_queue=max_queue,
            max_retry_after_s=60, seed=seed, overload=overload,
            classes=classes if classes is not None else any(f.priority or f.tenant for f in flows),
            priority_aging_s=priority_aging_s,
        )  # fmt: skip
        self.results = [FlowResult() for _ in flows]
        self.waiting: dict[Waiter, _Request] = {}
        self._events: list[tuple[float, int, str, object]] = []
        self.duration_s = 0.0
        self._sequence = itertools.count()
        self.stood_s = 0.0  # how long the status said the queue stands
        self._stood_since_s: float | None = None

    def at(self, when_s: float, kind: str, payload: object) -> None:
        heapq.heappush(self._events, (when_s, next(self._sequence), kind, payload))

    def run(self, duration_s: float) -> list[FlowResult]:
        self.duration_s = duration_s
        for index, flow in enumerate(self.flows):
            if flow.clients is None:
                self.at(self.random.expovariate(flow.rate_per_s), "arrival", index)
            else:  # the pool starts at once, as a batch job's workers do
                for _ in range(flow.clients):
                    self.at(0.0, "arrival", index)
        handlers: dict[str, Callable[[object], None]] = {
            "arrival": self.arrival, "finish": self.finish, "timeout": self.timeout,
        }  # fmt: skip
        while self._events:
            when_s, _, kind, payload = heapq.heappop(self._events)
            if kind == "arrival" and when_s > duration_s:
                continue  # no new arrivals; what is in flight or waiting plays out
            self.now_s = when_s
            handlers[kind](payload)
            self.collect()
            self.watch_standing()
        return self.results

    def watch_standing(self) -> None:
        detector = self.core.detector
        standing = detector is not None and detector.overloaded
        if standing and self._stood_since_s is None:
            self._stood_since_s = self.now_s
        elif not standing and self._stood_since_s is not None:
            self.stood_s += self.now_s - self._stood_since_s
            self._stood_since_s = None

    def next_of(self, request: _Request, pause_s: float = 0.0) -> None:
        """A closed loop's client sends its next request once answered."""
        if self.flows[request.flow].clients is not None:
            self.at(self.now_s + pause_s, "arrival", request.flow)

    def arrival(self, payload: object) -> None:
        index = int(payload)  # type: ignore[call-overload]
        flow = self.flows[index]
        if flow.clients is None:
            self.at(self.now_s + self.random.expovariate(flow.rate_per_s), "arrival", index)
        request = _Request(index, self.now_s, self.service_s * self.random.uniform(0.8, 1.2))
        self.results[index].offered += 1
        admission = self.core.arrive(
            flow.deadline_s,
            route=ROUTE,
            priority=flow.priority,
            tenant=flow.tenant,
            now_s=self.now_s,
            units=flow.units,
        )
        if admission is ADMITTED:
            self.start(request)
        elif isinstance(admission, Reason):
            self.reject(request, admission)
        else:
            request.waiter = admission
            self.waiting[admission] = request
            self.at(self.now_s + self.core.wait_budget_s(admission, self.now_s), "timeout", request)

    def start(self, request: _Request) -> None:
        waited_s = self.now_s - request.arrived_s
        request.ticket = self.core.admitted(self.now_s, waited_s, self.flows[request.flow].units, route=ROUTE)
        self.results[request.flow].waits_s.append(waited_s)
        self.at(self.now_s + request.service_s, "finish", request)

    def finish(self, payload: object) -> None:
        assert isinstance(payload, _Request) and payload.ticket is not None
        self.core.release(payload.ticket, self.now_s, Outcome.COMPLETED)
        latency_s = self.now_s - payload.arrived_s
        result = self.results[payload.flow]
        self.next_of(payload)
        if self.now_s > self.duration_s:
            return  # the tail after the last arrival: not counted, so goodput is per second of load
        if latency_s <= self.flows[payload.flow].deadline_s:
            result.on_time += 1
            result.latencies_s.append(latency_s)
        else:
            result.late += 1

    def timeout(self, payload: object) -> None:
        assert isinstance(payload, _Request) and payload.waiter is not None
        if self.waiting.pop(payload.waiter, None) is None:
            return  # started or refused already
        self.core.leave(payload.waiter, self.now_s)  # a slot granted in this very instant goes on to the next
        self.reject(payload, Reason.DEADLINE, timed_out=True)

    def reject(self, request: _Request, reason: Reason, *, timed_out: bool = False) -> None:
        flow = self.flows[request.flow]
        self.core.rejected(reason, timed_out=timed_out, priority=flow.priority, tenant=flow.tenant, now_s=self.now_s)
        self.results[request.flow].rejected += 1
        self.results[request.flow].rejected_after_s += self.now_s - request.arrived_s
        self.next_of(request, flow.pause_s)

    def collect(self) -> None:
        """Start the waiters the line granted a slot, answer those it refused."""
        for waiter in [w for w in self.waiting if w.granted or w.refused is not None]:
            request = self.waiting.pop(waiter)
            if waiter.granted:
                self.start(request)
            else:
                self.reject(request, Reason.DEADLINE, timed_out=True)


def capacity_per_s(limit: int = LIMIT, service_s: float = SERVICE_S) -> float:
    return limit / service_s


def overload_rows(duration_s: float, seed: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    capacity = capacity_per_s()
    for factor in (2, 4):
        for mode in ("lifo", "shed", "off"):
            [result] = Replay([Flow(factor * capacity)], overload=mode, seed=seed).run(duration_s)
            p99_ms = (percentiles_ms(result.latencies_s) or {"p99": 0.0})["p99"]
            rows.append({
                "load": f"{factor}x", "overload": mode,
                "goodput_vs_capacity": round(result.on_time / duration_s / capacity, 3),
                "p99_ms": p99_ms, "p99_vs_deadline": round(p99_ms / 1000 / DEADLINE_S, 3),
                "late": result.late, "rejected": result.rejected,
                "503_after_ms": round(1000 * result.rejected_after_s / max(1, result.rejected), 1),
                "offered": result.offered,
            })  # fmt: skip
    return rows


def closed_loop_rows(duration_s: float, seed: int) -> list[dict[str, object]]:
    """Pools of clients that FIFO serves in full: no mode may turn one away."""
    rows: list[dict[str, object]] = []
    capacity = capacity_per_s()
    for clients in (8, 24, 128):
        for mode in ("lifo", "shed", "off"):
            flow = Flow(0.0, deadline_s=60.0, clients=clients, pause_s=0.05)
            replay = Replay([flow], overload=mode, seed=seed, max_queue=512)
            [result] = replay.run(duration_s)
            p99_ms = (percentiles_ms(result.latencies_s) or {"p99": 0.0})["p99"]
            rows.append({
                "clients": clients, "overload": mode,
                "goodput_vs_capacity": round(result.on_time / duration_s / capacity, 3),
                "answered_200": result.on_time, "rejected": result.rejected, "p99_ms": p99_ms,
                "in_overload_s": round(replay.stood_s, 3),
            })  # fmt: skip
    return rows


def tenant_rows(duration_s: float, seed: int) -> list[dict[str, object]]:
    capacity = capacity_per_s()
    light, heavy = 2 * capacity / 11, 20 * capacity / 11  # 10x apart, 2x capacity in all
    rows: list[dict[str, object]] = []
    for tenants in (True, False):
        flows = [Flow(light, tenant="light" if tenants else None), Flow(heavy, tenant="heavy" if tenants else None)]
        results = Replay(flows, seed=seed, classes=True).run(duration_s)
        for name, flow, result in zip(("light", "heavy"), flows, results, strict=True):
            rows.append({
                "tenant option": "x-tenant" if tenants else "none", "tenant": name,
                "offered_per_s": round(flow.rate_per_s, 1), "on_time_per_s": round(result.on_time / duration_s, 1),
                "share_of_offered": round(result.on_time / max(1, result.offered), 3), "late": result.late,
            })  # fmt: skip
    return rows


def priority_rows(duration_s: float, seed: int) -> list[dict[str, object]]:
    """A tenth of the load at priority 1 within 4x capacity: how long the important wait."""
    capacity = capacity_per_s()
    flows = [Flow(0.4 * capacity, priority=1), Flow(3.6 * capacity)]
    results = Replay(flows, seed=seed).run(duration_s)
    rows: list[dict[str, object]] = []
    for name, flow, result in zip(("priority 1", "priority 0"), flows, results, strict=True):
        waits = percentiles_ms(result.waits_s) or {"p50": 0.0, "p99": 0.0}
        rows.append({
            "class": name, "offered_per_s": round(flow.rate_per_s, 1),
            "on_time_per_s": round(result.on_time / duration_s, 1),
            "share_of_offered": round(result.on_time / max(1, result.offered), 3),
            "wait_p50_ms": waits["p50"], "wait_p99_ms": waits["p99"], "late": result.late,
        })  # fmt: skip
    return rows


def table(rows: list[dict[str, object]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    service_ms = SERVICE_S * 1000
    print(f"capacity {capacity_per_s():.0f}/s (limit {LIMIT}, {service_ms:.0f} ms +-20%), deadline {DEADLINE_S} s, "
          f"{args.duration_s:.0f} s of virtual time, seed {args.seed}\n")  # fmt: skip
    overload = overload_rows(args.duration_s, args.seed)
    print(table(overload) + "\n")
    closed_loop = closed_loop_rows(args.duration_s, args.seed)
    print(table(closed_loop) + "\n")
    tenants = tenant_rows(args.duration_s, args.seed)
    print(table(tenants) + "\n")
    priorities = priority_rows(args.duration_s, args.seed)
    print(table(priorities))
    if args.json is not None:
        document = {
            "environment": environment(),
            "command": f"python -m benchmarks.overload --duration-s {args.duration_s:g} --seed {args.seed}",
            "overload": overload, "closed_loop": closed_loop, "tenants": tenants, "priorities": priorities,
        }  # fmt: skip
        args.json.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
