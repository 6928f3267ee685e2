"""How much more one route's requests hold on the card than another's, learned from readings.

Without `cost` every request weighs one slot, so a route whose requests hold four times the bytes
of another's counts as one of them. A reading is one number for everything in flight, but the mix
of routes in flight varies from reading to reading, so a least-squares fit of the used bytes
against each route's requests in flight tells each route's bytes per request (per unit of `cost`).
A route's weight is its bytes over the mean request's (the traffic's at the first fit; later fits
keep that scale): the limit keeps counting typical requests, and a request takes as many of them
as it holds memory. Arithmetic on observations: the simulator replays it exactly.

Where requests allocate a while after their admission (an input decoded first), readings stray below
the line by the requests caught before they allocate, and no fit explains them all. The line of the
readings less the others' bytes that lie on and above it (`least_squares.fit_above`) tells each
route's bytes where enough readings caught every request allocated, and corrects a `cost` told off
their ratio. Where too few did and no request came with a `cost`, the routes get their first weights
from a fit of all the readings less the others' bytes that tells each route's bytes to a fifth
(`NOISY_SHARE`; the readings share requests in flight, so the bar is looser than it says): counted
as one, a mix of routes whose large requests hold three times the small ones' ran out of memory five
times a second.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import NamedTuple

from .least_squares import LINE_TOLERANCE, distinct, dot, fit_above, least_squares, relative_errors

__all__ = ["MAX_ROUTES", "RouteWeights"]

MAX_ROUTES = 8  # routes told apart; the rest share one column, weighing 1 (bounded, whatever the app has)
OTHERS = MAX_ROUTES  # the column of the routes past the first few
WINDOW_READINGS = 48  # readings a fit looks at: about 5 s at the default sample period
MIN_READINGS = 16  # readings with requests in flight before the first fit
MIN_SPAN_S = 1.5  # or half as many, where they span this long (readings further apart turn more over)
WEIGHT_RANGE = (1 / 16, 16.0)  # no route weighs less than a 16th of the mean request, nor 16 times it
RATIO_TOLERANCE = math.log(1.05)  # routes' weights against each other: closer than 5% is no change
SHARE_DECAY = 0.98  # per reading: the mix of requests that defines "the mean request" follows traffic
NOISY_SHARE = 0.2  # a fit of readings that stray stands where each route's bytes are known to this share
# A route's requests varied on their own where they did at this many runs of readings of the window at least,
# however seldom that is among the rest (a large route among many small requests, whose requests fill most of the
# card and run alone). Runs, not readings: at one, the fit rests on one request, and one caught before it failed to
# allocate, at one reading or two in a row, weighed its route at a fraction of the others.
MIN_APART = 2


class _Reading(NamedTuple):
    """One reading with more than one route in flight."""

    when_s: float
    row: list[float]  # slots in flight by column
    used_bytes: float
    others_bytes: float | None  # the others' bytes as the memory model held them, where it did
    admitted: int  # the requests admitted until then


class RouteWeights:
    """The weight learned for one request (one unit of cost) of each route, from readings of the
    card beside the slots each route's requests held then (`reading`, once per reading)."""

    def __init__(self, *, window: int = WINDOW_READINGS) -> None:
        if window < MIN_READINGS:
            raise ValueError(f"window must be >= {MIN_READINGS} readings, got {window}")
        self.by_route: dict[object, float] = {}  # learned weights; a route not here weighs 1
        self._columns: dict[object, int] = {}  # route -> its column in the readings
        self._shares = [0.0] * (OTHERS + 1)  # by column: requests in flight, decayed per reading
        self._recent: deque[_Reading] = deque(maxlen=window)
        self.fits = 0
        self.changed_s = -math.inf  # when the weights last changed (the time the readings carried)
        self.costs_told = False  # set by the core once any request came with a `cost` other than 1

    def weight(self, route: object) -> float:
        """What one unit of `route`'s cost weighs in slots: 1 until readings tell routes apart."""
        return self.by_route.get(route, 1.0)

    def weights(self) -> dict[str, float]:
        """Each learned weight by its route's label (`str(route)` where it has none), for the status.
        Two routes may share a label (one app mounted twice): the second is shown as "label (2)"."""
        shown: dict[str, float] = {}
        for route, weight in self.by_route.items():
            label = name = str(getattr(route, "label", route))
            copies = 1
            while name in shown:
                copies += 1
                name = f"{label} ({copies})"
            shown[name] = round(weight, 3)
        return shown

    def forget(self) -> None:
        """The card changed under the readings (a neighbour came): a fit across it is no fit."""
        self._recent.clear()

    def requests(self, route: object, units: float) -> float:
        """What a request that takes `units` slots of `route` weighs before its weight, to the 64th
        (sums of 64ths add and take away exactly): counted in flight as it is admitted."""
        weight = self.by_route.get(route, 1.0)
        return units if weight == 1.0 else round(units / weight * 64) / 64

    def slots(self, requests_by_route: dict[object, float]) -> float:
        """What `requests_by_route` (`requests`) are worth in slots now."""
        weight = self.weight
        return sum(n * weight(route) for route, n in requests_by_route.items())

    def reading(
        self,
        used_bytes: float,
        requests_by_route: dict[object, float],
        others_bytes: float | None = None,
        now_s: float = -math.inf,
        admitted: int = 0,
    ) -> bool:
        """`observe`, with each route's requests in flight (`requests`) as many slots as they are
        worth now, not the slots they took under older weights (those bend the next fit)."""
        weight = self.weight
        units = {route: n * weight(route) for route, n in requests_by_route.items()}
        return self.observe(used_bytes, units, others_bytes, now_s, admitted)

    def observe(
        self,
        used_bytes: float,
        units_by_route: dict[object, float],
        others_bytes: float | None = None,
        now_s: float = -math.inf,
        admitted: int = 0,
    ) -> bool:
        """A reading of the card's used bytes at `now_s`, beside the slots each route's requests held
        then, and the others' bytes (weights, neighbours) as the memory model holds them, where it
        does; `admitted`: the requests admitted until then (the last one's `Ticket.serial`). True when
        the weights changed with it: what one slot means changed."""
        shares = self._shares
        for column in range(len(shares)):
            shares[column] *= SHARE_DECAY
        row = [0.0] * (OTHERS + 1)
        for route, units in units_by_route.items():
            if units <= 0:
                continue
            column = self._column(route)
            row[column] += units
            shares[column] += units / self.weight(route)
        if len(self._columns) < 2:
            return False  # one route: nothing to tell apart
        if any(row):
            self._recent.append(_Reading(now_s, row, float(used_bytes), others_bytes, admitted))
        recent = self._recent
        enough = len(recent) >= MIN_READINGS or (
            len(recent) >= MIN_READINGS // 2 and recent[-1].when_s - recent[0].when_s >= MIN_SPAN_S
        )
        changed = enough and self._fit()
        if changed:
            self.changed_s = now_s
        return changed

    def failed(self, route: object, requests: float, serial: int) -> None:
        """A request of `route` (`requests` before its weight), the `serial`-th admitted, ran out of
        memory: the readings since counted it in flight while it held nothing, and it leaves them.
        Told by the admissions each reading came after, not by time: a reading at the very moment of
        the admission (on virtual time, work and readings of round lengths) may have come either side."""
        column = self._columns.get(route, OTHERS if len(self._columns) >= MAX_ROUTES else None)
        if column is None:
            return
        slots = requests * self.weight(route)
        for reading in self._recent:
            if reading.admitted >= serial:
                reading.row[column] = max(0.0, reading.row[column] - slots)

    def _column(self, route: object) -> int:
        column = self._columns.get(route)
        if column is not None:
            return column
        if len(self._columns) >= MAX_ROUTES:
            return OTHERS  # fitted, so they bend no route's bytes, but not weighed
        column = self._columns[route] = len(self._columns)
        self._recent.clear()  # a new column: old readings do not have it
        return column

    def _fit(self) -> bool:
        """Least squares `used = baseline + sum(bytes_r * slots_r)`; accepted only where every
        route's requests varied on their own and the line explains the readings (a neighbour's
        arrival inside the window does not: wait until it has passed out). Where the slots in flight
        never varied in sum, the baseline is the others' bytes the memory model held at each reading."""
        rows = [(reading.row, reading.used_bytes) for reading in self._recent]
        # Whether a route's requests varied, counted in requests, not slots (a light route's slots barely vary).
        weight_of = {c: self.weight(route) for route, c in self._columns.items()}
        columns = [c for c in range(OTHERS + 1) if _route_varies([row[c] / weight_of.get(c, 1.0) for row, _ in rows])]
        if len(columns) < 2:
            return False
        design = [[1.0, *(row[c] for c in columns)] for row, _ in rows]
        used = [y for _, y in rows]
        others = [r.others_bytes for r in self._recent if r.others_bytes is not None]
        intercept = len(others) < len(rows) or _varies([sum(row) for row, _ in rows])
        if not intercept:
            # The slots in flight summed to one total at every reading (a gate held at its limit): no
            # intercept can be told apart, and the others' bytes as the memory model holds them stand in.
            design = [[0.0, *x[1:]] for x in design]
            used = [y - o for y, o in zip(used, others, strict=True)]
        solution = _trimmed_fit(design, used, [weight_of.get(c, 1.0) for c in columns], intercept=intercept)
        if solution is None and len(others) == len(rows):
            # No line explains them all: requests caught before they allocated (an input decoded first) lie
            # below it. The line of the readings on and above it tells each route's bytes where those are
            # enough; it corrects a `cost` told off the bytes' ratio (a large route told 1.5 times its
            # bytes ran two thirds of the large requests that fit beside the small ones).
            ours = [y - o for (_, y), o in zip(rows, others, strict=True)]
            slots = [x[1:] for x in design]
            weights = [weight_of.get(c, 1.0) for c in columns]
            solution = _above(slots, ours, weights)
            if solution is None and not self.by_route and not self.costs_told:
                # Where no request came with a cost and no route is weighed yet, a fit of all the readings
                # less the others' bytes beats counting each request as one. Not to correct weights (the fit
                # of readings that stray is biased: requests caught before they allocate are not in
                # proportion to those in flight) nor a `cost`: a ratio told exactly, allocating late, moved
                # to three fifths of it and cost tens of OOMs a minute.
                solution = _noisy_fit(slots, ours)
        if solution is None:
            return False
        bytes_per_unit = solution[1:]
        routes = {c: r for r, c in self._columns.items() if c in columns}
        if len(routes) < 2:
            return False  # one route beside the others' column: nothing to weigh against
        self.fits += 1
        # A route's bytes per request are its bytes per slot times its weight now (the window starts
        # again whenever weights change).
        fitted = dict(zip(columns, bytes_per_unit, strict=True))
        per_request = {c: fitted[c] * self.weight(route) for c, route in routes.items()}
        columns = list(routes)
        shares = {c: max(self._shares[c], 1e-9) for c in columns}
        total_share = sum(shares.values())
        mean_bytes = sum(shares[c] * per_request[c] for c in columns) / total_share
        # The scale stays (a slot keeps meaning the same bytes to the memory model): a change of
        # weights only moves the routes against each other.
        mean_weight = sum(shares[c] * self.weight(routes[c]) for c in columns) / total_share
        low, high = WEIGHT_RANGE
        new = {c: min(high, max(low, mean_weight * per_request[c] / mean_bytes)) for c in columns}
        moves = [math.log(new[c] / self.weight(routes[c])) for c in columns]
        scale = sum(moves) / len(moves)
        if max(abs(m - scale) for m in moves) <= RATIO_TOLERANCE:
            return False  # the routes weigh as they did against each other: refined, not changed
        for c in columns:
            self.by_route[routes[c]] = new[c]
        self._recent.clear()  # readings weighed with the old weights would bend the next fit
        return True


def _trimmed_fit(
    design: list[list[float]], used: list[float], weights: list[float], *, intercept: bool = True
) -> list[float] | None:
    """The least-squares solution, where it explains the readings: each route's bytes positive, and
    the readings within a quarter of the lightest route's bytes of it, in the mean. Else once more
    without the quarter that stray most (requests that failed, or had not allocated yet, hold less
    than their slots say). `weights`: each column's weight. Without `intercept`, the design's first
    column is zeros and the solution's first term 0."""
    for attempt in range(2):
        solution = least_squares(design if intercept else [x[1:] for x in design], used)
        if solution is not None and not intercept:
            solution = [0.0, *solution]
        if solution is None or min(solution[1:]) <= 0:
            return None
        errors = [(y - dot(x, solution)) ** 2 for x, y in zip(design, used, strict=True)]
        # A quarter of the lightest route's bytes per request, not per slot (a light route's slot is tiny).
        tolerance_sq = (0.25 * min(b * w for b, w in zip(solution[1:], weights, strict=True))) ** 2
        if sum(errors) / len(errors) <= tolerance_sq:
            return solution
        if attempt == 0:
            # In the order they came, so that runs of readings stay runs (`_route_varies`)
            kept = sorted(sorted(range(len(errors)), key=errors.__getitem__)[: len(errors) - len(errors) // 4])
            design, used = [design[i] for i in kept], [used[i] for i in kept]
            if any(not _route_varies([row[c + 1] / w for row in design]) for c, w in enumerate(weights)):
                return None
    return None


def _above(slots: list[list[float]], ours: list[float], weights: list[float]) -> list[float] | None:
    """`fit_above` of our bytes against the slots of each route (`weights`: each column's weight), where
    every route's requests varied among the readings left, with a tenth of the lightest route's bytes
    per request as the tolerance; with a leading 0, as `_trimmed_fit`'s solution."""

    def tolerance(solution: list[float]) -> float:
        return LINE_TOLERANCE * min(b * w for b, w in zip(solution, weights, strict=True))

    def varies(kept: list[list[float]]) -> bool:
        return all(_route_varies([row[c] / w for row in kept]) for c, w in enumerate(weights))

    solution = fit_above(*distinct(slots, ours), tolerance, varies)
    return None if solution is None else [0.0, *solution]


def _noisy_fit(design: list[list[float]], used: list[float]) -> list[float] | None:
    """The least-squares solution without intercept (a leading 0, as `_trimmed_fit`'s), where every
    route's bytes are positive and known to `NOISY_SHARE` (their standard error, as a share of them)."""
    solution = least_squares(design, used)
    if solution is None or min(solution) <= 0:
        return None
    residuals = [y - dot(x, solution) for x, y in zip(design, used, strict=True)]
    errors = relative_errors(design, residuals, solution)
    return [0.0, *solution] if errors is not None and max(errors) <= NOISY_SHARE else None


def _varies(values: list[float]) -> bool:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values) >= 0.1


def _route_varies(values: list[float]) -> bool:
    """Whether a route's requests in flight (one value a reading) varied: as `_varies`, or in `MIN_APART` runs
    of readings at least half a request away from the value most readings had."""
    if _varies(values):
        return True
    most = Counter(values).most_common(1)[0][0]
    apart = [abs(v - most) >= 0.5 for v in values]
    return sum(a and not (i and apart[i - 1]) for i, a in enumerate(apart)) >= MIN_APART
