"""The memory model: how many requests fit on the card, learned from (in-flight, used) readings.

The manual recipe is "measure used memory with nothing running, then with one request, and take
the difference". `MemoryModel` does it continuously, and follows a neighbour process, inputs that
grow and a mix of sizes. Like the controllers it is arithmetic on observations: the time is passed
in, so the simulator replays it exactly.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from dataclasses import dataclass

from ._checks import check_fraction

__all__ = ["BLIND_GROWTH_AFTER_SAMPLES", "MemoryEstimate", "MemoryModel"]


@dataclass(frozen=True)
class MemoryEstimate:
    baseline_bytes: float
    per_request_bytes: float
    total_bytes: int
    spread_bytes: float = 0.0


SPREAD_FADE_DIVISOR = 5  # the spread fades with halflife_s / this
# Readings in a row that must show room coming back before it is believed.
RELIEF_READINGS = 3
# Busy samples after which a model that still has no cap (requests that hold next to nothing on the
# card) stops holding growth back.
BLIND_GROWTH_AFTER_SAMPLES = 20


class MemoryModel:
    """Learns the idle baseline and the bytes each request adds, from (in-flight, used) samples.

    The manual recipe is "measure used memory with nothing running, then with one request, and
    take the difference". Done continuously, two ways:

    * when in-flight varied over the last `window` samples (since the card last got tighter: a line
      across a change is no line) and they lie on one line, a least-squares fit gives both at once
      (its intercept is the baseline, its slope one request's bytes);
    * otherwise samples with nothing in flight give the baseline, and busy samples within the
      requests' usual spread teach their mean bytes, smoothed with the half-life `halflife_s`.

    Memory first: from one busy level alone, a neighbour that came and requests that grew look the
    same. A rise beyond the usual spread is taken for the others' (a neighbour, a leak, a fatter
    input): the room shrinks at once, before the next admission, not after an OOM; a fit over
    levels tells later whose bytes they were. Relief is believed once `RELIEF_READINGS` readings in a
    row show it (a neighbour that left gives its room back within three sample periods; fewer may
    be requests admitted and not yet allocated), at the most cautious of them.

    Requests of different sizes (a mixed workload) are described by a mean and an upward spread
    (how far above the mean requests go); the cap keeps `baseline + n * mean + spread_z * sqrt(n) *
    spread` under target, the sum of n such requests: cautious with the large ones, without planning
    for the worst of all at once.
    """

    def __init__(
        self,
        *,
        target_utilisation: float = 0.97,
        halflife_s: float = 5.0,
        window: int = 32,
        min_request_fraction: float = 0.001,
        spread_z: float = 1.0,
    ) -> None:
        self.target_utilisation = check_fraction("target_utilisation", target_utilisation)
        if isinstance(spread_z, bool) or not isinstance(spread_z, int | float) or not 0 <= spread_z < math.inf:
            raise ValueError(f"spread_z must be a finite number >= 0, got {spread_z!r}")
        self.spread_z = float(spread_z)
        if not halflife_s > 0:  # NaN too
            raise ValueError(f"halflife_s must be > 0, got {halflife_s}")
        if window < 4:
            raise ValueError(f"window must be >= 4 samples, got {window}")
        self._halflife_s = halflife_s
        # The least a request (or unit of cost) is taken to hold: > 0, or a reading where used
        # memory did not move would size a request at 0 bytes and the room at a division by zero.
        self._min_request_fraction = check_fraction("min_request_fraction", min_request_fraction)
        self._recent: deque[tuple[float, float]] = deque(maxlen=window)
        self._last_s: float | None = None
        self._baseline: float | None = None
        self._per_request: float | None = None
        self._spread_sq = 0.0  # variance of one request's bytes
        # Lower baselines seen in the last readings: believed when RELIEF_READINGS in a row agree.
        self._pending_relief: list[float] = []
        self._since_shrink = 0  # readings since the last rise was believed: only these prove a level
        self._last_moved_baseline: float | None = None
        self._moves: deque[float] = deque(maxlen=16)  # |move| of the apparent baseline, reading to reading
        self._total_bytes = 0
        self.samples = 0
        self.busy_samples = 0

    @property
    def learning(self) -> bool:
        """Samples flow but the cap is not known yet: growing now would be blind."""
        known = self._per_request is not None and self._baseline is not None  # estimate() without building one
        return self.samples > 0 and not known and self.busy_samples < BLIND_GROWTH_AFTER_SAMPLES

    def add(self, now_s: float, in_flight: float, used_bytes: int, total_bytes: int) -> None:
        elapsed_s = 0.0 if self._last_s is None else max(0.0, now_s - self._last_s)
        self._last_s = now_s
        self._total_bytes = total_bytes
        # A spread that no reading renews fades, with a fifth of the half-life (1 s by default): one
        # odd event (a neighbour's step, a request read between its admission and its allocation)
        # must not cost a level for long; on a card that fits five with 0.28 GiB to spare, 0.13 GiB
        # of spread costs the fifth. A real mix renews it at every reading.
        self._spread_sq *= 0.5 ** (elapsed_s / (self._halflife_s / SPREAD_FADE_DIVISOR))
        self.samples += 1
        used = float(used_bytes)
        self.busy_samples += in_flight > 0
        self._recent.append((in_flight, used))
        self._since_shrink += 1
        if self._fit_recent():
            self._pending_relief.clear()
            return
        if in_flight <= 0:
            self._pending_relief.clear()
            self._baseline = used  # nothing of ours runs: this is exactly what the others hold
            return
        if self._baseline is None:
            return  # busy since the start and no spread yet: nothing to tell the baseline by
        if self._per_request is None:
            self._baseline = min(self._baseline, used)  # whatever runs, the baseline is no more than this
            share = (used - self._baseline) / in_flight
            if share >= self._min_request_fraction * total_bytes:
                self._per_request = share
            return
        self._read_busy(used, in_flight, elapsed_s)

    def _read_busy(self, used: float, in_flight: float, elapsed_s: float) -> None:
        """One reading with requests in flight. A change beyond the requests' usual spread is the
        others' (a neighbour, a leak, inputs that grew): the room shrinks at once and comes back when
        `RELIEF_READINGS` readings agree. Our requests' bytes are learned where they can be told apart from the
        others': in-flight that varies (`_fit_recent`), a reading with nothing in flight, and drift
        within the spread."""
        assert self._per_request is not None and self._baseline is not None
        moved_baseline = used - self._per_request * in_flight
        noise_bytes = 2 * math.sqrt(self._spread_sq * in_flight)  # how far n requests stray in all
        jumped = self._jumped(moved_baseline)
        if moved_baseline > self._baseline + noise_bytes:
            self._pending_relief.clear()
            self._baseline = moved_baseline
            if jumped:
                self._forget_proof()
        elif moved_baseline < 0:
            # No baseline explains it: the requests are smaller than believed (or not allocated yet).
            self._pending_relief.clear()
            self._add_share((used - self._baseline) / in_flight, in_flight, elapsed_s)
        elif moved_baseline < self._baseline - noise_bytes:
            self._relieve(moved_baseline)
        else:
            self._pending_relief.clear()
            self._add_share((used - self._baseline) / in_flight, in_flight, elapsed_s)

    def _jumped(self, moved_baseline: float) -> bool:
        """Whether the apparent baseline moved from the last reading's by more than it usually does
        (three times the median move): a change of the card (a neighbour came, inputs grew), after
        which old readings prove nothing. A mix of sizes moves it on every reading: no change."""
        last, self._last_moved_baseline = self._last_moved_baseline, moved_baseline
        if last is None:
            return True
        move = abs(moved_baseline - last)
        self._moves.append(move)
        return move > 3 * statistics.median(self._moves)

    def units_changed(self) -> None:
        """What one slot holds changed (routes got their weights): in-flight counts read before are
        in other units, and a line across the change would be no line. The estimates stay: a change
        of weights keeps the scale, so a slot holds about the bytes it held."""
        self._recent.clear()
        self._since_shrink = 0

    def _forget_proof(self) -> None:
        """The card changed for the worse: a level that fitted before proves nothing now."""
        self._since_shrink = 1

    def _relieve(self, baseline: float) -> None:
        """The others hold less than believed: taken when `RELIEF_READINGS` readings in a row agree,
        at the most cautious of them. Fewer would mistake the moments between a request's admission
        and its allocation (or between its freeing and its release) for room: at 50 requests a
        second, two readings in a row catch such a moment every few seconds."""
        pending = self._pending_relief
        pending.append(baseline)
        if len(pending) < RELIEF_READINGS:
            return
        self._baseline = max(pending)
        pending.clear()

    def _add_share(self, share: float, in_flight: float, elapsed_s: float) -> None:
        """One sample of the mean bytes of `in_flight` requests: update their mean and spread."""
        assert self._per_request is not None
        deviation = share - self._per_request
        # A mean of n requests strays by about spread / sqrt(n): more than twice that is a shift.
        shifted_up = deviation > 2 * math.sqrt(self._spread_sq / in_flight)
        self._per_request = max(
            self._min_request_fraction * self._total_bytes,
            self._smooth(self._per_request, share, elapsed_s, fast=shifted_up),
        )
        if shifted_up or deviation <= 0:
            # A change of level is no spread; nor is a reading below the mean, which is as often a
            # request admitted but not yet allocated as a small one. Only the large ones count.
            return
        spread_seen = in_flight * deviation * deviation
        self._spread_sq = self._smooth(self._spread_sq, spread_seen, elapsed_s, fast=spread_seen > self._spread_sq)

    def _smooth(self, current: float, seen: float, elapsed_s: float, *, fast: bool) -> float:
        """Move towards `seen`: fast for danger, slowly for relief."""
        halflife_s = self._halflife_s / 10 if fast else self._halflife_s
        weight = 1.0 - 0.5 ** (elapsed_s / halflife_s) if elapsed_s > 0 else 0.5
        return current + weight * (seen - current)

    def _fit_recent(self) -> bool:
        recent = list(self._recent)[-self._since_shrink :]  # a line across a change of the card is no line
        n = len(recent)
        if n < 8:
            return False
        mean_x = sum(x for x, _ in recent) / n
        mean_y = sum(y for _, y in recent) / n
        var_x = sum((x - mean_x) ** 2 for x, _ in recent) / n
        most_common = max(Counter(x for x, _ in recent).values())
        if var_x < 0.1 or most_common > 0.875 * n or n - most_common < 2:
            # In-flight barely varied: a few stray samples must not tilt the line, and one alone
            # (a neighbour's blip read at another level) would set its slope all by itself.
            return False
        slope = sum((x - mean_x) * (y - mean_y) for x, y in recent) / n / var_x
        if slope < self._min_request_fraction * self._total_bytes:
            return False
        intercept = mean_y - slope * mean_x
        residual_sq = sum((y - intercept - slope * x) ** 2 for x, y in recent) / n
        if residual_sq > (0.25 * slope) ** 2:
            return False  # not one line: the window straddles a change (sizes, a neighbour); wait it out
        lowest_used = min(y for _, y in recent)
        self._baseline = min(lowest_used, max(0.0, intercept))
        self._per_request = slope
        self._spread_sq = residual_sq / max(1.0, mean_x)  # y strays by sqrt(n) times one request's spread
        return True

    def estimate(self) -> MemoryEstimate | None:
        if self._per_request is None or self._baseline is None:
            return None
        return MemoryEstimate(self._baseline, self._per_request, self._total_bytes, math.sqrt(self._spread_sq))

    def room(self) -> float | None:
        """How many requests of the mean size the card has room for under target, as a fraction."""
        est = self.estimate()
        if est is None:
            return None
        return (self.target_utilisation * est.total_bytes - est.baseline_bytes) / est.per_request_bytes

    def cap(self) -> int | None:
        """How many requests fit under `target_utilisation` of the card, or None if not known yet."""
        est = self.estimate()
        if est is None:
            return None
        room_bytes = self.target_utilisation * est.total_bytes - est.baseline_bytes
        n = max(0, math.floor(room_bytes / est.per_request_bytes))
        while n > 0 and n * est.per_request_bytes + self.spread_z * math.sqrt(n) * est.spread_bytes > room_bytes:
            n -= 1
        # What was seen beats what is estimated: a level that ran in every recent sample under target
        # fits, even where a noisy estimate puts the line a few percent too high.
        return max(n, self._proven_level())

    def _proven_level(self) -> int:
        recent = list(self._recent)[-self._since_shrink :]
        if 2 * len(recent) < (self._recent.maxlen or 0):
            return 0  # too few samples (since the card last changed for the worse) to call anything proven
        limit_bytes = self.target_utilisation * self._total_bytes
        peak_by_level: dict[float, float] = {}
        for in_flight, used in recent:
            peak_by_level[in_flight] = max(used, peak_by_level.get(in_flight, 0.0))
        # Every level up to the proven one must be under target too: memory grows with the level.
        proven = 0
        for level in sorted(peak_by_level):
            if peak_by_level[level] > limit_bytes:
                break
            proven = math.floor(level)
        return proven
