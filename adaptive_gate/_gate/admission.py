"""Whether a request that finds no free slot may wait, and for how long: the core's slow path.

A place in the line is worth something only if the answer can still arrive while the client
waits for it. So a newcomer is turned away at once when its expected wait plus its route's
expected service time is past its deadline, and the place it gets carries the latest moment it
may still start (`Waiter.latest_start_s`): the line refuses it then rather than grant a slot
to work whose answer nobody would read.

When the queue is in overload (`OverloadDetector` in `overload.py`: a standing line that grows faster than
the slots take it in, too long to wait out first come first served), `overload` says what the gate
does:

- "lifo" (the default): serve newest first until it ends (adaptive LIFO), and answer at once
  whoever could no longer be served before its deadline with the newer ones served first (its
  wait so far, the line ahead of it at the drain rate, and its work);
- "shed": stay first come first served, but turn away at arrival whoever would wait longer than
  the detector's interval;
- "off": none of this; a FIFO line bounded by deadlines alone.

A line of any length that drains within its deadlines is never in overload: first come, first
served, under every mode.

`benchmarks/overload.py` compares the three; `docs/benchmarks.md` has its table.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from .accounts import ServiceEstimates
from .limiter import Limiter
from .overload import OverloadDetector
from .queue import Waiter
from .reasons import Reason

__all__ = ["OVERLOAD_MODES", "DrainRate", "Queueing", "queue_up"]

OVERLOAD_MODES = ("lifo", "shed", "off")
DRAIN_WINDOW_S = 10.0
DRAIN_MIN_SPAN_S = 0.5  # below this, a rate is mostly noise
DRAIN_POINT_EVERY_S = 0.1


class Queueing(Protocol):
    """What the line is judged by: the core's limiter, overload detector and service times."""

    limiter: Limiter
    detector: OverloadDetector | None
    services: ServiceEstimates
    overload: str
    queue_target_s: float | None

    def expected_wait_s(self, ahead: int) -> float | None: ...


def queue_up(
    core: Queueing,
    now_s: float,
    timeout_s: float,
    service_s: float,
    priority: int,
    tenant: str | None,
    units: float = 1,
) -> Reason | Waiter:
    """No free slot: a place in the line, or the reason there is none (see the module's docstring)."""
    limiter, detector = core.limiter, core.detector
    line = limiter.line
    if detector is not None and core.queue_target_s is None:
        mean_s = core.services.mean_s()
        if mean_s is not None:
            detector.set_target(mean_s)
    budget_s = timeout_s - service_s  # the longest it may wait and still finish in time
    wait_s = core.expected_wait_s(line.ahead_of(priority, tenant))
    late = wait_s is not None and wait_s > budget_s
    fifo_wait_s = core.expected_wait_s(len(line))
    shed = (
        detector is not None
        and detector.overloaded
        and core.overload == "shed"
        and fifo_wait_s is not None
        and fifo_wait_s > detector.interval_s
    )
    if detector is not None:
        # Whoever found no free slot arrives: joining, shed, or too late for the line.
        detector.arrived(now_s, wait_s=fifo_wait_s, budget_s=budget_s)
    if late or timeout_s <= 0:  # a deadline of 0 (`queue_timeout=0`): run now or not at all
        return Reason.DEADLINE
    if shed:
        return Reason.OVERLOAD
    if detector is not None and detector.overloaded and core.overload == "lifo":
        answer_the_buried(core, now_s, priority)
    if len(line) >= limiter.max_queue:
        victim = line.evictable(priority, tenant)
        if victim is None:
            return Reason.QUEUE_FULL
        limiter.evict(victim, Reason.EVICTED)
    return limiter.join(Waiter(priority, tenant, now_s + budget_s, units), now_s=now_s)


def answer_the_buried(core: Queueing, now_s: float, priority: int) -> None:
    """Newest first in overload: whoever has everybody newer served before it, and could no longer
    start before its latest start even so, will not be served. Answer them now (`503 deadline`, the
    oldest first), so their clients can go elsewhere at once, and the line stays as deep as is
    useful. A long deadline keeps a deep line; a short one, a short line."""
    limiter = core.limiter
    line = limiter.line
    while line:
        deepest = line.most_buried(priority, now_s)
        if deepest is None:
            return
        buried, ahead = deepest
        wait_s = core.expected_wait_s(ahead)
        if wait_s is None or now_s + wait_s <= buried.latest_start_s:
            return
        limiter.evict(buried, Reason.DEADLINE)


class DrainRate:
    """Requests ended per second, over the last `DRAIN_WINDOW_S`, from the core's counters.

    Read when a Retry-After is worked out (a rejection: the slow path), so it costs the requests
    that are served nothing; points are kept at most every `DRAIN_POINT_EVERY_S`.
    """

    def __init__(self) -> None:
        self._points: deque[tuple[float, int]] = deque(maxlen=128)

    def rate_per_s(self, ended: int, now_s: float) -> float | None:
        points = self._points
        if not points or now_s - points[-1][0] >= DRAIN_POINT_EVERY_S:
            points.append((now_s, ended))
        while len(points) > 2 and now_s - points[1][0] >= DRAIN_WINDOW_S:
            points.popleft()
        first_s, first_ended = points[0]
        span_s = now_s - first_s
        if span_s < DRAIN_MIN_SPAN_S or ended <= first_ended:
            return None
        return (ended - first_ended) / span_s
