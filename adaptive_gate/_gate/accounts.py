"""Counts per priority and per tenant, bounded whatever the clients send.

Priorities are clamped into `[PRIORITY_MIN, PRIORITY_MAX]` where they are read, so their table is
small by construction. Tenant names come from the clients, so a hostile one could send a new name
with every request: the table keeps at most `MAX_TENANTS` names, and a newcomer that finds it full
takes the place of the quietest (fewest arrivals, then least recently seen), whose counts move to
"other". The busiest stay, the tail folds away, and memory stays bounded. The status and the
metrics show the busiest `TENANTS_SHOWN` and the rest as "other".

Per-service-time and per-route expectations live here too (`ServiceEstimates`): what the core
needs to know whether a request can still finish before its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MAX_TENANTS",
    "NO_TENANT",
    "OTHER",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "ClassCounts",
    "ServiceEstimates",
    "Tally",
]

PRIORITY_MIN, PRIORITY_MAX = -100, 100
MAX_TENANTS = 256  # names tracked; each costs a few hundred bytes
TENANTS_SHOWN = 10
OTHER = "other"
NO_TENANT = "(none)"  # requests that named no tenant: one tenant of their own
MAX_ROUTES = 1024
SMOOTHING = 0.1  # weight of the newest service time in the moving mean and deviation
DEVIATIONS = 3.0  # the service time planned for: mean + 3 mean deviations
# A route whose mean is past the deadlines is still tried this often (or once per mean), by a request of any
# deadline: where each has less than half the mean (a slow warm-up, then clients of 200 ms), a bar on short ones
# refused the route for ever.
PROBE_EVERY_S = 1.0


@dataclass
class Tally:
    """What became of one class's requests: all that arrived, and those turned away (503/429) or
    gone before a slot; the rest were admitted."""

    arrived: int = 0
    rejected: int = 0
    left: int = 0
    last_seen: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "arrived": self.arrived,
            # Not turned away nor gone (yet): a waiter counts until it is answered. Never below 0:
            # a tenant dropped from the table may see a rejection for an arrival "other" holds.
            "admitted": max(0, self.arrived - self.rejected - self.left),
            "rejected": self.rejected,
            "left": self.left,
        }

    def absorb(self, other: Tally) -> None:
        self.arrived += other.arrived
        self.rejected += other.rejected
        self.left += other.left


class ClassCounts:
    """Tallies per priority and per tenant; see the module's docstring for the bound on tenants."""

    def __init__(self) -> None:
        self.priorities: dict[int, Tally] = {}
        self.tenants: dict[str, Tally] = {}
        self.other = Tally()
        self._seen = 0

    def arrived(self, priority: int, tenant: str | None) -> None:
        self._priority(priority).arrived += 1
        self._tenant(tenant).arrived += 1

    def rejected(self, priority: int, tenant: str | None) -> None:
        self._priority(priority).rejected += 1
        self._tenant(tenant).rejected += 1

    def left(self, priority: int, tenant: str | None) -> None:
        self._priority(priority).left += 1
        self._tenant(tenant).left += 1

    def _priority(self, priority: int) -> Tally:
        tally = self.priorities.get(priority)
        if tally is None:
            tally = self.priorities[priority] = Tally()
        return tally

    def _tenant(self, tenant: str | None) -> Tally:
        name = NO_TENANT if tenant is None else tenant
        self._seen += 1
        tally = self.tenants.get(name)
        if tally is None:
            if len(self.tenants) >= MAX_TENANTS:
                quietest = min(self.tenants, key=lambda n: (self.tenants[n].arrived, self.tenants[n].last_seen))
                self.other.absorb(self.tenants.pop(quietest))
            tally = self.tenants[name] = Tally()
        tally.last_seen = self._seen
        return tally

    def shown_tenants(self, top: int = TENANTS_SHOWN) -> dict[str, dict[str, int]]:
        """The busiest `top` tenants by arrivals, and everything else as "other"."""
        ranked = sorted(self.tenants.items(), key=lambda item: -item[1].arrived)
        shown = {name: tally.as_dict() for name, tally in ranked[:top]}
        rest = Tally()
        rest.absorb(self.other)
        for _, tally in ranked[top:]:
            rest.absorb(tally)
        if rest.arrived:
            shown[OTHER] = rest.as_dict()
        return shown

    def shown_priorities(self) -> dict[str, dict[str, int]]:
        return {str(priority): self.priorities[priority].as_dict() for priority in sorted(self.priorities)}


class ServiceEstimates:
    """How long a request of each route takes: a moving mean and mean deviation (as TCP estimates
    a round trip, RFC 6298), so one slow answer moves the estimate a little and a changed route
    moves it soon.

    Two figures come out. The mean is what a request is expected to take: one whose whole deadline
    is shorter is turned away even with a slot free. The plan (mean + `DEVIATIONS` deviations, as
    a retransmission timeout is set, because it must rarely be exceeded) is what a waiter must
    still have left when its turn comes: admitting work that answers after the client left wastes a
    slot twice (its own, and the one who could have used it).

    An estimate only moves with answers, so one that says "longer than any deadline" would turn
    the route away for ever (one slow warm-up would do it). `may_probe` lets a request through now
    and then to measure again.
    """

    def __init__(self) -> None:
        self._by_route: dict[object, list[float]] = {}  # [mean, deviation, last answer or probe]
        # The mean, kept ready: every request asks it (one dict lookup on the admission path).
        self.mean_by_route: dict[object, float] = {}

    def add(self, route: object, service_s: float, now_s: float) -> None:
        """One answer of `route` that took `service_s`: every successful request's path, kept lean."""
        estimate = self._by_route.get(route)
        if estimate is None:
            self._first(route, service_s, now_s)
            return
        mean_s = estimate[0]
        error_s = service_s - mean_s
        estimate[1] += SMOOTHING * ((error_s if error_s >= 0.0 else -error_s) - estimate[1])
        mean_s += SMOOTHING * error_s
        estimate[0] = mean_s
        estimate[2] = now_s
        self.mean_by_route[route] = mean_s

    def _first(self, route: object, service_s: float, now_s: float) -> None:
        if len(self._by_route) >= MAX_ROUTES:
            oldest = next(iter(self._by_route))
            del self._by_route[oldest], self.mean_by_route[oldest]
        self._by_route[route] = [service_s, service_s / 2, now_s]  # RFC 6298's first estimate
        self.mean_by_route[route] = service_s

    def planned_s(self, route: object) -> float | None:
        """The service time a waiter of `route` must have left; None before it has finished once."""
        estimate = self._by_route.get(route)
        return None if estimate is None else estimate[0] + DEVIATIONS * estimate[1]

    def may_probe(self, route: object, timeout_s: float, now_s: float) -> bool:
        """Whether a request of `route` whose deadline is shorter than the mean may run anyway, to
        measure the route again: once per `PROBE_EVERY_S` (or per mean) without an answer."""
        estimate = self._by_route[route]
        mean_s = estimate[0]
        if now_s - estimate[2] < max(PROBE_EVERY_S, mean_s):
            return False
        estimate[2] = now_s
        return True

    def mean_s(self) -> float | None:
        """The mean over routes: the queue's delay target is derived from it."""
        if not self._by_route:
            return None
        return sum(self.mean_by_route.values()) / len(self.mean_by_route)
