"""One benchmark run: a policy in front of a simulated card, a load, and what came out of it.

The app is the same for every policy: a sync route that holds its bytes on a `SimulatedGPU` while
it computes (processor sharing past the card's knee). Only what stands in front of it changes:

* `none`: nothing; an OOM is a 500.
* `static-N`: `asyncio.Semaphore(N)` and a thread pool of N, the recipe users copy today.
* `oracle`: a semaphore resized at the very moment the card changes to exactly what fits then
  (where sizes are drawn, a byte budget that knows each size). It knows the future: the ceiling.
* `reader`: a byte budget resized from each reading of the card every 0.1 s, knowing each
  request's exact bytes: the ceiling for any gate that reads the card.
* `adaptive`: `AdaptiveGate` with its defaults, told nothing about the card (in the mixed-cost
  scenario, told what each request weighs through its `cost` hook).

Clients send their deadline in `x-envoy-expected-rq-timeout-ms` and give up when it passes;
goodput counts the successes that came back within it. An OOM strikes 30% into a request's work
(activations grow through a forward pass), so a failed request has used the card for nothing.
Where the scenario has a `crash_s`, an OOM takes the worker down for that long, as an
unrecoverable CUDA error does in production: requests in flight then and arriving meanwhile fail.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import ASGIApp

from adaptive_gate import AdaptiveGate
from adaptive_gate.simulation import CLIENT_PAUSE_S
from adaptive_gate.statistics import LimitChange
from adaptive_gate.status import percentiles_ms
from adaptive_gate.testing import SimulatedGPU
from demo_service.policies import SemaphoreMiddleware

from .fronts import CrashSimulator, OracleMiddleware, ReaderMiddleware, header
from .model import INFER_PATHS, GiB, Phase, Scenario, Size

__all__ = ["DEADLINE_S", "OOM_AFTER_FRACTION", "GiB", "Phase", "RunResult", "Scenario", "Size", "run"]


@dataclass
class RunResult:
    scenario: str
    policy: str
    load: str
    duration_s: float
    sent: int = 0
    ok: int = 0
    ok_in_deadline: int = 0
    rejected: int = 0
    server_errors: int = 0
    crashed: int = 0
    client_gave_up: int = 0
    ooms: int = 0
    latencies_s: list[float] = field(default_factory=list)
    reject_answer_s: list[float] = field(default_factory=list)
    oom_times_s: list[float] = field(default_factory=list)
    controller: dict[str, Any] | None = None  # the adaptive gate's controller at the end
    # The adaptive gate's changes of the limit: (seconds into the run, old, new, why)
    limit_changes: list[tuple[float, int, int, str]] = field(default_factory=list)
    # (t, limit, in_flight, queued, used_bytes)
    series: list[tuple[float, float, int, int, int]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        settle = settle_time_s(self.series)
        latency = percentiles_ms(self.latencies_s, digits=1) or {}
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "load": self.load,
            "sent": self.sent,
            "goodput_per_s": round(self.ok_in_deadline / self.duration_s, 2),
            "ok": self.ok,
            "p50_ms": latency.get("p50"),
            "p95_ms": latency.get("p95"),
            "p99_ms": latency.get("p99"),
            "rejected_503": self.rejected,
            "reject_answer_ms_mean": None
            if not self.reject_answer_s
            else round(statistics.mean(self.reject_answer_s) * 1000, 1),
            "ooms": self.ooms,
            "errors_500": self.server_errors,
            "crash_failures": self.crashed,
            "client_gave_up": self.client_gave_up,
            "settle_s": settle,
            "ooms_after_settle": None if settle is None else sum(t > settle for t in self.oom_times_s),
            "controller_at_end": self.controller,
            "limit_changes": self.limit_changes,
        }


def settle_time_s(series: list[tuple[float, float, int, int, int]]) -> float | None:
    """When the limit came within one of where it ended (the median of the last quarter) for good."""
    if not series:
        return None
    limits = [row[1] for row in series]
    final = statistics.median(limits[-max(1, len(limits) // 4) :])
    for index in range(len(series) - 1, -1, -1):
        if abs(series[index][1] - final) > 1:
            return round(series[index + 1][0], 2) if index + 1 < len(series) else None
    return 0.0


class World:
    """The card, the scenario's phase, and the app with a policy in front of it."""

    def __init__(self, scenario: Scenario, policy: str, *, duration_s: float, seed: int) -> None:
        self.scenario = scenario
        self.policy = policy
        self.duration_s = duration_s
        self.random = random.Random(seed)
        self.gpu = SimulatedGPU(
            scenario.total_bytes,
            baseline_bytes=scenario.weights_bytes,
            knee=scenario.knee,
            fragmentation=scenario.fragmentation,
            seed=seed,
        )
        self.started_s = time.monotonic()
        self.phase = scenario.phases[0]
        self.down_until_s = 0.0
        self.crashes = 0
        self.running = 0
        self.oom_times_s: list[float] = []
        self.limit_changes: list[tuple[float, int, int, str]] = []  # the adaptive gate's, with why
        self.oracle: OracleMiddleware | None = None
        self.reader: ReaderMiddleware | None = None
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()
        self.gate: AdaptiveGate | None = None
        self.semaphore: SemaphoreMiddleware | None = None
        if self.policy == "adaptive":
            told = None if self.scenario.cost is None else lambda scope: float(header(scope, b"x-cost"))
            app.add_middleware(AdaptiveGate, probe=self.gpu, sample_period=self.scenario.sample_period_s, cost=told)
        elif self.policy == "oracle":
            app.add_middleware(OracleMiddleware, world=self)
        elif self.policy == "reader":
            app.add_middleware(ReaderMiddleware, world=self)
        elif self.policy.startswith("static-"):
            app.add_middleware(SemaphoreMiddleware, limit=int(self.policy.split("-")[1]), paths=set(INFER_PATHS))
        app.add_middleware(CrashSimulator, world=self)
        world = self

        @app.post("/infer/large", tags=["gpu"])  # where the scenario gives large requests their own route
        @app.post("/infer", tags=["gpu"])
        def infer(request: Request) -> dict[str, bool]:
            nbytes = int(request.headers["x-request-bytes"])
            work_s = float(request.headers["x-work-s"])
            world.running += 1
            try:
                time.sleep(float(request.headers["x-start-delay-s"]))  # a decode on the CPU: nothing on the card yet
                try:
                    allocation = world.gpu.allocate(nbytes).__enter__()
                except RuntimeError:
                    # A forward pass runs out of memory part-way: the work done until then is lost.
                    world.gpu.compute(OOM_AFTER_FRACTION * work_s)
                    raise
                try:
                    world.gpu.compute(work_s)
                finally:
                    allocation.release()
            except RuntimeError:
                world.oom_times_s.append(world.elapsed_s())
                if world.scenario.crash_s > 0:
                    world.crashes += 1
                    world.down_until_s = time.monotonic() + world.scenario.crash_s
                raise
            finally:
                world.running -= 1
            return {"ok": True}

        return app

    def _limit_changed(self, change: LimitChange) -> None:
        assert self.gate is not None
        why = self.gate.core.controller.describe().get("why", change.reason)
        self.limit_changes.append((round(self.elapsed_s(), 3), change.old, change.new, str(why)))

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s

    def request(self) -> tuple[str, dict[str, str]]:
        """What a client sends: the path, its deadline, its size (which the app allocates) and what
        it weighs."""
        nbytes = self.phase.request_bytes(self.random)
        delay_s = self.random.uniform(0.0, self.scenario.start_delay_s) if self.scenario.start_delay_s else 0.0
        headers = {
            "x-envoy-expected-rq-timeout-ms": str(int(DEADLINE_S * 1000)),
            "x-request-bytes": str(nbytes),
            "x-work-s": str(self.scenario.work(self.random)),
            "x-start-delay-s": str(delay_s),
        }
        if self.scenario.cost is not None:
            headers["x-cost"] = str(self.scenario.cost(nbytes))
        return ("/infer" if self.scenario.route is None else self.scenario.route(nbytes)), headers

    def advance_phase(self) -> None:
        fraction = self.elapsed_s() / self.duration_s
        phase = [p for p in self.scenario.phases if p.at_fraction <= fraction][-1]
        if phase is not self.phase:
            self.phase = phase
            if self.oracle is not None:
                self.oracle.resize(phase)
        if phase.neighbour_step_bytes:
            self.gpu.grow_neighbour(phase.neighbour_step_bytes, phase.neighbour_bytes)
        else:
            self.gpu.set_neighbour(phase.neighbour_bytes)

    def observe(self) -> tuple[float, float, int, int, int]:
        if self.gate is None:
            self.gate = _find(self.app, AdaptiveGate)
            self.semaphore = _find(self.app, SemaphoreMiddleware)
            if self.gate is not None:
                self.gate.core.limit_listeners.append(self._limit_changed)
        if self.gate is not None:
            limit: float = self.gate.core.limiter.limit
            queued = self.gate.core.limiter.queued
        elif self.oracle is not None:
            limit, queued = self.oracle.limit, self.oracle.limiter.queued
        elif self.reader is not None:
            limit, queued = self.reader.limit, self.reader.limiter.queued
        elif self.semaphore is not None:
            limit, queued = self.semaphore.limit, self.semaphore.waiting
        else:
            limit, queued = math.inf, 0
        return (round(self.elapsed_s(), 2), limit, self.running, queued, self.gpu.used_bytes)


OOM_AFTER_FRACTION = 0.3
DEADLINE_S = 5.0


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI, lifespan: bool) -> AsyncIterator[ASGIApp]:
    if not lifespan:
        yield app
        return
    async with LifespanManager(app) as manager:
        yield manager.app


def _find(app: FastAPI, kind: type) -> Any:
    node: Any = app.middleware_stack
    while node is not None:
        if isinstance(node, kind):
            return node
        node = getattr(node, "app", None)
    return None


async def run(
    scenario: Scenario, policy: str, *, load: str, rate_per_s: float | None, clients: int | None,
    duration_s: float, seed: int = 1,
) -> RunResult:  # fmt: skip
    """Open loop (Poisson at `rate_per_s`) or closed loop (`clients` sending back to back)."""
    world = World(scenario, policy, duration_s=duration_s, seed=seed)
    result = RunResult(scenario.name, policy, load, duration_s)
    limiter = anyio.to_thread.current_default_thread_limiter()
    default_tokens = limiter.total_tokens
    if policy.startswith("static-"):
        limiter.total_tokens = int(policy.split("-")[1])  # the recipe's pool of N workers
    arrivals = random.Random(seed + 1)
    try:
        async with (
            _lifespan(world.app, scenario.lifespan) as app,  # as uvicorn does: the gate's sampler starts here
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app, raise_app_exceptions=False),
                base_url="http://bench",
                timeout=DEADLINE_S,
            ) as client,
            anyio.create_task_group() as tg,
        ):
            await client.get("/nothing")  # builds the middleware stack before the clock starts
            world.started_s = time.monotonic()
            stop_at = world.started_s + duration_s

            async def one() -> bool:
                """One request, answered or not: True where it succeeded."""
                result.sent += 1
                started = time.monotonic()
                response = None
                with anyio.move_on_after(DEADLINE_S):  # the client's deadline, all included
                    try:
                        path, headers = world.request()
                        response = await client.post(path, headers=headers)
                    except httpx.TimeoutException:
                        pass
                if response is None:
                    result.client_gave_up += 1
                    return False
                finished = time.monotonic()
                took_s = finished - started
                if response.status_code == 200:
                    result.ok += 1
                    result.latencies_s.append(took_s)
                    # Goodput: successes within the deadline that completed inside the measured window.
                    result.ok_in_deadline += took_s <= DEADLINE_S and finished <= stop_at
                elif response.status_code in (429, 503):
                    result.rejected += 1
                    result.reject_answer_s.append(took_s)
                elif response.status_code == 502:
                    result.crashed += 1
                else:
                    result.server_errors += 1
                return response.status_code == 200

            async def observer() -> None:
                ticks, tick_s = 0, 0.01
                reading_ticks = max(1, round(world.scenario.sample_period_s / tick_s))
                while time.monotonic() < stop_at + DEADLINE_S:
                    world.advance_phase()  # every 10 ms: a greedy neighbour grabs memory that soon
                    if ticks % 10 == 0:
                        result.series.append(world.observe())
                    if world.reader is not None and ticks % reading_ticks == 0:
                        world.reader.read()  # at the gate's sample period
                    ticks += 1
                    await anyio.sleep(tick_s)

            async def closed_loop_client() -> None:
                while time.monotonic() < stop_at:
                    if not await one():
                        # A refusal or a failure, as the simulator's clients do: a round trip before
                        # the next try. In process, an answer that needs no thread (a 502 from a worker
                        # that is down) never yields to the loop: 32 clients asking back to back held
                        # it for seconds, and no timer, reading or observation ran meanwhile.
                        await anyio.sleep(CLIENT_PAUSE_S)

            tg.start_soon(observer)
            if clients is not None:
                for _ in range(clients):
                    tg.start_soon(closed_loop_client)
            else:
                assert rate_per_s is not None
                next_s = time.monotonic()
                while True:
                    next_s += arrivals.expovariate(rate_per_s)
                    if next_s >= stop_at:
                        break
                    await anyio.sleep_until(next_s)
                    tg.start_soon(one)
            await anyio.sleep_until(stop_at + DEADLINE_S + 0.2)
            tg.cancel_scope.cancel()
    finally:
        limiter.total_tokens = default_tokens
    result.ooms = world.gpu.oom_count
    result.oom_times_s = world.oom_times_s
    if world.gate is not None:
        result.controller = world.gate.core.controller.describe()
        result.limit_changes = world.limit_changes
    return result
