"""Whether a request that finds no free slot may wait, and for how long: the core's slow path.

A place in the line is worth something only if the answer can still arrive while the client
waits for it. So a newcomer is turned away at once when its expected wait plus its route's
expected service time is past its deadline, and the place it gets carries the latest moment it
may still start (`Waiter.latest_start_s`): the line refuses it then rather than grant a slot
to work whose answer nobody would read.

When the queue stands (`_codel.ControlledDelay`), `overload` says what the gate does about it:

- "lifo" (the default): serve newest first until the line drains (adaptive LIFO);
- "shed": stay first come first served, but turn away at arrival whoever would wait longer than
  the controller's interval;
- in both, while it stands nobody waits longer than its patience: half its deadline less its
  work, at most eight intervals (at least one turn): given up when its turn comes after that, or
  when that time has passed;
  newest first also answers at once whoever is buried deeper than the slots can serve in that time;
- "off": none of this; a FIFO line bounded by deadlines alone.

`benchmarks/overload.py` compares the three; the README has its table.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from ._queue import Waiter

if TYPE_CHECKING:
    from .core import GateCore

__all__ = ["OVERLOAD_MODES", "DrainRate", "queue_up"]

OVERLOAD_MODES = ("lifo", "shed", "off")
PATIENCE_INTERVALS = 8  # a burst that drains within eight intervals (32 service times) is served whole
DRAIN_WINDOW_S = 10.0
DRAIN_MIN_SPAN_S = 0.5  # below this, a rate is mostly noise
DRAIN_POINT_EVERY_S = 0.1


def queue_up(
    core: GateCore, timeout_s: float, service_s: float, priority: int, tenant: str | None, units: float = 1
) -> str | Waiter:
    """No free slot: a place in the line, or the reason there is none (see the module's docstring)."""
    limiter, delay = core.limiter, core.delay
    line = limiter.line
    if delay is not None and core.queue_target_s is None:
        mean_s = core.services.mean_s()
        if mean_s is not None:
            delay.set_target(mean_s)
    budget_s = timeout_s - service_s  # the longest it may wait and still finish in time
    wait_s = core.expected_wait_s(line.ahead_of(priority, tenant))
    if wait_s is not None and wait_s > budget_s:
        return "deadline"
    patience_s = math.inf
    if delay is not None:
        # While the queue stands, an answer should come within half the deadline (a success, not a
        # near miss), and a 503 soon: newest first rarely serves whoever waited PATIENCE_INTERVALS
        # intervals. A tenant's turn among N takes N intervals, so never less than that.
        turns_s = delay.interval_s * line.turns(priority)
        patience_s = max(turns_s, min(timeout_s / 2 - service_s, PATIENCE_INTERVALS * turns_s))
        if delay.overloaded:
            if core.overload == "shed":
                fifo_wait_s = core.expected_wait_s(len(line))
                if fifo_wait_s is not None and fifo_wait_s > delay.interval_s:
                    return "overload"
            else:
                answer_the_buried(core, patience_s, priority)
            budget_s = min(budget_s, patience_s)
    if len(line) >= limiter.max_queue:
        victim = line.evictable(priority)
        if victim is None:
            return "queue_full"
        limiter.evict(victim, "evicted")
    return limiter.join(Waiter(priority, tenant, core._clock() + budget_s, patience_s, units))


def answer_the_buried(core: GateCore, patience_s: float, priority: int) -> None:
    """Newest first under a standing queue: whoever is deeper than the slots can serve within
    their patience will only be served if the arrivals stop, and will wait their whole patience
    for that. Answer them now (`503 deadline`, the oldest first), so their clients can go elsewhere
    at once, and the line stays as deep as it is useful."""
    mean_s = core.service_s.mean()
    if not mean_s:
        return
    limiter = core.limiter
    line = limiter.line
    depth = max(1, int(patience_s * limiter.limit / mean_s))
    while len(line) >= depth:
        buried = line.oldest(priority)
        if buried is None:
            return
        limiter.evict(buried, "deadline")


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
