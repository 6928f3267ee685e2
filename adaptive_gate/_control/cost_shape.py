"""What a `cost` says of a request's bytes where they are not in proportion to it: a part per request.

A batch of n images holds a workspace of its own beside n images' activations, so its bytes are
`fixed + n * per_image`, not `n * per_unit`. Told n, the gate takes a unit for at least what a reading
showed one holding: the batch of one's, whose unit carries the whole workspace, and a batch of eight
then weighs nearly twice the bytes it holds (a third of the card idle, where the workspace is a few
units'). From the readings, a least-squares fit of the used bytes against the requests in flight and
the units they were told tells the two apart, as the route fit tells routes apart; a request told
`cost` then weighs `offset + scale * cost` slots, scaled so that the mean request keeps its weight (the
limit keeps counting the units it counted). Where costs are in proportion to the bytes, the fit finds
no part per request and nothing changes. Readings that caught requests before they allocated (an input
decoded first) lie below the line and are set aside; where no line explains the rest, nothing changes.
One route only: several are the route fit's.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

from .least_squares import LINE_TOLERANCE, distinct, fit_above
from .route_weights import MIN_READINGS

__all__ = ["CostShape"]

# Readings a fit looks back over: about 10 s at the default sample period. Where requests allocate a while after
# their admission, a reading catches all in flight holding their bytes one time in four or fewer, and only those
# lie on the line; the fit needs `least_squares.MIN_KEPT` of them.
WINDOW_READINGS = 96
# A fit is tried every this many readings (a fit that sets readings aside takes a millisecond: at a reading
# every 10 ms, one each time would take a tenth of the event loop)
FIT_EVERY = 8
MOVE_TOLERANCE = math.log(1.05)  # the heaviest request against the lightest closer than 5% to before is no change
MIN_MIX_SPREAD = 0.1  # the units of the mean request in flight must vary by this share, or none can be told apart
MIN_APART = 3  # readings, at least, whose mean request is that far from the median's


class _Reading(NamedTuple):
    requests: float  # requests in flight
    units: float  # the slots they took, at the shape of the time (one shape a window: it starts anew)
    used_bytes: float
    others_bytes: float  # the others' bytes as the memory model held them


class CostShape:
    """`offset + scale * cost`: the slots a request told `cost` takes, learned from readings (`reading`)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.scale = 1.0
        self.fits = 0
        self._before = (0.0, 1.0)  # the shape before the last change
        self._least, self._most = math.inf, 0.0  # the least and the most cost told (`told`)
        self._recent: deque[_Reading] = deque(maxlen=WINDOW_READINGS)
        self._untried = 0  # readings since a fit was last tried

    def shown(self) -> dict[str, float] | None:
        """For the status: a request told `cost` weighs `per_request + per_unit * cost` slots; None while
        the cost is taken in proportion to the bytes."""
        if self.offset == 0.0:
            return None
        return {"per_request": round(self.offset, 3), "per_unit": round(self.scale, 3)}

    def again(self, slots: float) -> float:
        """What a request that took `slots` under the shape before the last change weighs now."""
        offset, scale = self._before
        return self.slots((slots - offset) / scale)

    def slots(self, cost: float) -> float:
        """What a request told `cost` weighs (before its route's weight): `cost` until a fit shaped it."""
        return cost if self.offset == 0.0 else self.offset + self.scale * cost

    def told(self, cost: float) -> float:
        """`slots`, for a request told `cost` now: the least and most told are what a change must move."""
        if cost < self._least:
            self._least = cost
        if cost > self._most:
            self._most = cost
        return self.slots(cost)

    def reading(self, used_bytes: float, requests: float, units: float, others_bytes: float | None) -> float | None:
        """A reading of the card's used bytes beside `requests` in flight holding `units` slots. The bytes
        a slot holds under the new shape where the shape changed with it (in what those slots were
        worth before, the shape keeps the mean request's weight), else None."""
        if requests <= 0 or others_bytes is None:
            return None  # nothing of ours to weigh, or nothing to tell ours from the others' by
        self._recent.append(_Reading(requests, units, used_bytes, others_bytes))
        self._untried += 1
        if len(self._recent) < MIN_READINGS or self._untried < FIT_EVERY:
            return None
        self._untried = 0
        fitted = self._fit()
        if fitted is None:
            return None
        per_request, per_slot, mean_slots = fitted
        extra = per_request / per_slot  # the part per request, in slots
        squeeze = mean_slots / (mean_slots + extra)  # what keeps the mean request's weight
        # Judged by the lightest and heaviest request told (in flight, a mean of several moves less)
        lightest = min(self.slots(self._least), min(r.units / r.requests for r in self._recent))
        heaviest = max(self.slots(self._most), max(r.units / r.requests for r in self._recent))
        moves = [math.log(squeeze * (extra + w) / w) for w in (lightest, heaviest)]
        if moves[0] - moves[1] <= MOVE_TOLERANCE:
            return None  # in proportion, as far as the readings tell: the two weigh as they did against each other
        self._before = (self.offset, self.scale)
        self.offset = squeeze * (extra + self.offset)
        self.scale *= squeeze
        self.fits += 1
        self._recent.clear()  # readings of slots in the old shape would bend the next fit
        return per_slot / squeeze

    def _fit(self) -> tuple[float, float, float] | None:
        """`used = others + per_request * requests + per_slot * units` over the window, fitted to the readings
        on and above the line (`fit_above`: one below it caught requests before they allocated, or after they
        failed): the bytes per request and per slot, and the mean request's slots. None where the mean
        request did not vary in `MIN_APART` of the readings left (one cost, or always the same mix: no part
        per request can be told from a unit's share, and small noise, slots counted in 64ths, picks a split),
        or no line explains them."""
        rows, used = distinct(
            [[r.requests, r.units] for r in self._recent], [r.used_bytes - r.others_bytes for r in self._recent]
        )
        means = [units / n for n, units in rows]
        average = sum(means) / len(means)
        # A tenth of the lightest request's bytes, by the mean request's share of the readings
        mean_request_bytes = sum(ours / n for (n, _), ours in zip(rows, used, strict=True)) / len(rows)
        tolerance = LINE_TOLERANCE * mean_request_bytes * min(means) / average
        solution = fit_above(
            rows, used, lambda _: tolerance, lambda kept: _mix_varies([units / n for n, units in kept])
        )
        return None if solution is None else (solution[0], solution[1], average)


def _mix_varies(means: list[float]) -> bool:
    """Whether the mean request's slots (one value a reading) were more than `MIN_MIX_SPREAD` away from
    their median at `MIN_APART` readings at least: else the line is fixed by a reading or two."""
    middle = sorted(means)[len(means) // 2]
    return sum(abs(m - middle) > MIN_MIX_SPREAD * middle for m in means) >= MIN_APART
