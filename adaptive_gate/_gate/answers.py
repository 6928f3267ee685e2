"""The questions `GateCore` answers from its figures: when a client turned away should come back
(`Retry-After`), how long a newcomer would wait, whether the replica is ready, and what it serves
without. Kept apart from `core.py`, whose events are every request's path, so each file stays short;
`GateCore` inherits these as its own methods.
"""

from __future__ import annotations

import math
import random

from .admission import DrainRate
from .figures import Counters, RecentValues
from .limiter import Limiter
from .operator import OperatorBounds
from .tickets import _Probe

__all__ = ["CoreAnswers"]

MAX_REQUEST_SECONDS_ASSUMED = 1.0  # for Retry-After before any request has finished
PROBE_BROKEN_AFTER_ERRORS = 3  # the probe shows as degraded after this many failed readings in a row


class CoreAnswers:
    # What `GateCore` holds and these answers read.
    limiter: Limiter
    counters: Counters
    service_s: RecentValues
    drain: DrainRate
    probe: _Probe
    max_retry_after_s: int
    operator: OperatorBounds | None
    min_limit: int
    max_limit: int
    _random: random.Random
    units_per_request: float

    def bounds(self) -> tuple[int, int]:
        """The bounds in force: the operator's where set, else the configured ones."""
        if self.operator is None:
            return self.min_limit, self.max_limit
        return self.operator.min_limit, self.operator.max_limit

    def expected_wait_s(self, ahead: int) -> float | None:
        """How long one more request behind `ahead` others would wait, from recent service times and
        how many of the requests of late run at once: the limit over the slots they take, one at least
        (`GateCore.units_per_request`). Where requests weigh four slots on average (`cost`), a slot at a
        time read a line of a hundred as a fourth of its wait, the line never read as a standing queue,
        and served oldest first it held three large requests for one small at its head. Slots that do
        not pack read short: requests of 0.6 of a limit of 1 run one at a time, and their line reads as
        0.6 of its wait."""
        mean_service_s = self.service_s.mean()
        if mean_service_s is None:
            return None
        at_once = max(1.0, self.limiter.limit / self.units_per_request)
        return (ahead + 1) * mean_service_s / at_once

    def retry_after_s(self, now_s: float, priority: int = 0) -> int:
        """When to come back: the line ahead of `priority` over the measured drain rate (requests
        ended per second), or the service times while no drain has been measured yet."""
        limiter = self.limiter
        rate_per_s = self.drain.rate_per_s(self.counters.ended, now_s)
        ahead = limiter.line.ahead_of(priority)
        if rate_per_s is not None:
            estimate_s: float | None = (ahead + 1) / rate_per_s
        else:
            estimate_s = self.expected_wait_s(ahead)
        if estimate_s is None:
            estimate_s = MAX_REQUEST_SECONDS_ASSUMED
        # Jitter, so that the clients turned away together do not all come back together.
        estimate_s += self._random.uniform(0.0, 0.5 + 0.25 * estimate_s)
        return max(1, min(self.max_retry_after_s, math.ceil(estimate_s)))

    def readiness(self) -> tuple[bool, list[str]]:
        """Whether to send this replica traffic now, and if not, why.

        Only a full queue makes a replica unready. A broken probe does not: an NVML outage hits
        every replica at once, and taking them all out of rotation would turn a blind gate (which
        still serves on OOM and latency signals) into no service at all. It shows in `degraded`.
        """
        limiter = self.limiter
        # A full line refuses every newcomer, even with units free beside a heavy head that waits.
        if limiter.queued >= limiter.max_queue and (limiter.queued > 0 or limiter.in_flight >= limiter.limit):
            return False, [f"the queue is full ({limiter.queued} waiting)"]
        return True, []

    def degraded(self) -> list[str]:
        """What the gate serves without, while it still serves: said beside readiness, never instead of it."""
        errors = self.probe.consecutive_errors
        if errors >= PROBE_BROKEN_AFTER_ERRORS:
            return [f"the memory probe failed {errors} times in a row; serving on OOM and latency signals"]
        return []
