"""What the core hands out and is told back: a request's `Ticket` on its slots, the `Outcome` it
ended with, what it weighs (`units_of_cost`), how the memory probe fares, and the requests in flight
beside a reading (`InFlight`).

Kept apart from `core.py` so the drivers (the middleware, the simulator) and the core share these
small types without the core's bookkeeping around them.
"""

from __future__ import annotations

import math
import numbers
from enum import Enum
from typing import NamedTuple

from ..memory import MemorySample

__all__ = ["COST_QUANTUM", "MAX_COST", "InFlight", "Outcome", "Ticket", "units_of_cost"]

COST_QUANTUM = 1 / 64  # costs are counted in 64ths: sums of them are exact in binary, so nothing drifts
MAX_COST = float(1 << 20)


def units_of_cost(cost: object) -> float:
    """What a request weighs in slots, from the `cost` hook's answer: a finite number > 0, rounded
    to a 64th (at least one 64th). Any real number will do (a numpy scalar, a `Fraction`), since a
    hook often computes it from an array's shape."""
    weight = float(cost) if isinstance(cost, numbers.Real) and not isinstance(cost, bool) else math.nan
    if not 0 < weight <= MAX_COST:
        raise ValueError(
            f"the gate's cost hook must return a number > 0 and <= {MAX_COST:.0f}, in slots: a typical "
            f"request weighs about 1 (a batch of 8 images: 8; an image: its pixels / 224**2), got {cost!r}"
        )
    return max(COST_QUANTUM, round(weight / COST_QUANTUM) * COST_QUANTUM)


class InFlight(NamedTuple):
    """The requests in flight at one moment: slots taken, requests by route (`RouteWeights`), how many
    were admitted until then (a reading counted a ticket whose `serial` is at most that), and of the slots,
    what requests weigh beyond their own (`GateCore.granted`), and how many requests hold the slots."""

    units: float
    by_route: dict[object, float]
    admitted: int = 0
    heavier: float = 0.0
    requests: int = 0


class Outcome(Enum):
    COMPLETED = "completed"  # a response below 400: a latency sample for the controller
    FAILED = "failed"  # 4xx/5xx, an exception, a cancellation, a client gone: no sample
    OOM = "oom"  # it ran out of memory (the OOM itself is reported with `oom`)


class Ticket:
    """One admitted request's hold on a slot, given back exactly once through `GateCore.release`."""

    __slots__ = (
        "admitted_s", "busy_area_at_admission", "epoch", "serial", "in_flight_at_admission", "released",
        "sending_since_s", "abandoned", "units", "route", "requests", "heavier",
    )  # fmt: skip

    def __init__(
        self,
        admitted_s: float,
        busy_area: float,
        epoch: int,
        serial: int,
        in_flight: float,
        units: float = 1,
        route: object = None,
        requests: float | None = None,
        heavier: float = 0.0,
    ) -> None:
        self.admitted_s = admitted_s
        self.units = units  # what it weighs, in slots (the gate's `cost`; 1 without one)
        self.heavier = heavier  # of `units`, what it weighs beyond them as one from before the sizes shrank
        self.busy_area_at_admission = busy_area
        self.epoch = epoch
        # Whether it has run alone so far: nothing ran when it came in, and nothing came in since.
        self.serial = serial
        self.in_flight_at_admission = in_flight  # units in flight with it, as it came in
        self.released = False
        # Kept by the driver: since when its response has waited on the client (None: it does not),
        # and whether it was given up for that.
        self.sending_since_s: float | None = None
        self.abandoned = False
        self.route = route  # whose service time this one's teaches (None: one for all)
        # What it weighs before its route's weight (`GateCore.weigh`), as counted in flight for its
        # route at admission: given back exactly, whatever the route weighs by its release.
        self.requests = units if requests is None else requests


class _Probe:
    """How the memory probe fares, as the events have told it."""

    def __init__(self) -> None:
        self.description = "not started"
        self.device = "none"
        self.simulated = False
        self.last_sample: MemorySample | None = None
        self.last_error: str | None = None
        self.errors = 0
        self.consecutive_errors = 0
