"""The middleware and the simulator drive one core: fed the same events, they do the same.

The simulator runs a short classic scenario on virtual time and records every event it told the
core (arrivals, admissions that ran out of memory, completions, memory readings). The same events
are then replayed through the real middleware: real ASGI calls, an application that finishes each
request when the script says so, and a fake clock set to each event's time. Both must change the
limit at the same moments, from and to the same values, for the same reasons.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from adaptive_gate import AIMD, AdaptiveGate
from adaptive_gate.simulation import Phase, simulate
from adaptive_gate.statistics import LimitChange

from .asgi_helpers import RawClient, http_scope

pytestmark = pytest.mark.anyio

GiB = 2**30


class OutOfMemoryError(RuntimeError):
    """Named like torch's, as is_oom expects."""


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def scenario(**kwargs: Any) -> Any:
    return simulate(
        [Phase(0, rate_per_s=60, request_bytes=3 * GiB, work_s=0.1), Phase(2, 60, 6 * GiB, 0.1)],
        total_bytes=24 * GiB,
        baseline_bytes=8 * GiB,
        duration_s=4,
        knee=8,
        record=True,
        seed=7,
        **kwargs,
    )


async def replay(events: list[tuple[float, str, int, object]], controller: AIMD) -> list[tuple[float, int, int, str]]:
    outcome = {request: detail for _, kind, request, detail in events if kind == "start"}
    asked_gib = {request: detail / GiB for _, kind, request, detail in events if kind == "oom"}  # type: ignore[operator]
    finished = {request: anyio.Event() for _, kind, request, _ in events if kind == "arrive"}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = int(scope["path"].rsplit("/", 1)[1])
        await finished[request].wait()  # "finish", or "oom" where it runs out of memory
        if outcome.get(request) == "oom":  # (those still queued at the end have no outcome)
            raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {asked_gib[request]:.2f} GiB")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    clock = FakeClock()
    gate = AdaptiveGate(app, tag=None, probe=None, controller=controller, clock=clock, max_queue=128)
    changes: list[tuple[float, int, int, str]] = []

    def changed(change: LimitChange) -> None:
        changes.append((clock.now_s, change.old, change.new, change.reason))

    gate.core.limit_listeners.append(changed)
    async with gate.running(), anyio.create_task_group() as tg:
        for at_s, kind, request, detail in events:
            clock.now_s = at_s
            if kind == "arrive":
                tg.start_soon(gate, http_scope(f"/r/{request}"), RawClient().receive, RawClient().send)
            elif kind in ("finish", "oom"):
                finished[request].set()
            elif kind == "sample":
                gate.ops._on_sample(detail)  # type: ignore[arg-type]  # the sampler's own callback
            await settle()
        replayed = list(changes)
        for event in finished.values():  # the end: let everything finish, outside the comparison
            event.set()
    return replayed


async def settle() -> None:
    """Run the loop until every other task waits on something (anyio's own helper sleeps 0.1 s a
    round, too slow for hundreds of events)."""
    this = asyncio.current_task()
    for _ in range(10_000):
        await asyncio.sleep(0)
        waiting = (t._fut_waiter for t in asyncio.all_tasks() if t is not this)  # type: ignore[attr-defined]
        if all(future is not None and not future.done() for future in waiting):
            return
    raise AssertionError("the tasks never settled")


@pytest.mark.parametrize("oom_after_fraction", [0.0, 0.3])
async def test_the_middleware_replays_the_simulators_limit_trace(oom_after_fraction: float) -> None:
    """At once or part-way into the work (its slot held meanwhile), an OOM is told alike."""
    result = scenario(controller=AIMD(), oom_after_fraction=oom_after_fraction)
    assert result.ooms >= 1 and len(result.limit_changes) >= 4  # growth, OOM cuts and the memory cap
    reasons = {reason for *_, reason in result.limit_changes}
    assert "out of memory" in reasons and "memory" in reasons
    through_middleware = await replay(result.events, AIMD())
    assert through_middleware == result.limit_changes
