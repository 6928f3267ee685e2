"""How large the next batch may be: the card's room, the bytes an item takes, and the throughput knee.

Three bounds, the smallest wins (plus the user's `max_batch_size`):

* memory: the bytes a batch of n units of cost adds on the card are learned as `workspace + n *
  per_unit` (`ItemBytes`), from the highest reading seen while a batch ran against the reading
  taken just before it; the largest batch whose bytes fit under `target_utilisation` of the card,
  over what the last reading shows taken (by us at rest, or by a neighbour), is allowed. A reading
  before every batch is what makes it follow a neighbour that arrives or leaves.
* the knee (`Knee`): a larger batch must buy throughput. Batches are grouped by size in powers of
  two; the policy starts at one item and allows the next group only once that group ran at least
  `min_gain` faster per unit than the current one. On a card where batching pays (a batch of n
  takes a + b*n with a large a) it climbs to the memory bound; on the 2-core CPU, where ResNet-50
  ran slower per image in batches, it stays at small batches.
* out of memory: a batch that ran out holds the size below it (`oom_hold_s`, or until the room
  grows by an item), and raises the per-unit estimate where the estimate had said it would fit.

Like the controllers this is arithmetic on observations with the time passed in: the async layer
in `batch.py` and the virtual-time benchmark drive the same class.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .._checks import check_fraction

__all__ = ["BatchLimits", "BatchPolicy", "ItemBytes", "Knee"]

MAX_RETRY_FACTOR = 16  # a trial that keeps failing is retried at most this many times later
OOM_MARGIN = 1.05  # after an OOM, the per-unit estimate is raised at least this far past what failed


@dataclass(frozen=True)
class BatchLimits:
    """What the next batch may hold: `items` (knee, `max_batch_size`, an OOM), `units` of cost
    (memory; `math.inf` where no bound is known) and which bound binds, for the status."""

    items: int
    units: float
    bound: str


class ItemBytes:
    """`extra = workspace + units * per_unit`, fitted on the last `window` batches.

    Where the batches had more than one size, a least-squares line gives both terms; where they were
    all alike, the whole extra is put on the units (the workspace shared out), which overestimates a
    small batch's item and so errs towards smaller batches until sizes vary.
    """

    def __init__(self, window: int = 16) -> None:
        self._seen: deque[tuple[float, float]] = deque(maxlen=window)
        self._floor_per_unit = 0.0  # raised by an OOM the estimate did not foresee

    def observe(self, units: float, extra_bytes: float) -> None:
        if units > 0:
            self._seen.append((units, max(0.0, extra_bytes)))

    def oom(self, units: float, room_bytes: float) -> None:
        """A batch of `units` did not fit in `room_bytes`: each unit takes more than believed."""
        estimate = self.estimate()
        workspace = estimate[0] if estimate else 0.0
        if units > 0 and room_bytes > workspace:
            self._floor_per_unit = max(self._floor_per_unit, OOM_MARGIN * (room_bytes - workspace) / units)

    def relax(self) -> None:
        """The OOM's lesson expires with its hold: readings decide again."""
        self._floor_per_unit = 0.0

    def one_size(self) -> float | None:
        """The units every batch seen had, where they all had the same; else None."""
        sizes = {units for units, _ in self._seen}
        return sizes.pop() if len(sizes) == 1 else None

    def estimate(self) -> tuple[float, float] | None:
        """(workspace bytes, bytes per unit), or None before any batch was seen."""
        if not self._seen:
            return None
        workspace, per_unit = self._fit()
        return workspace, max(per_unit, self._floor_per_unit)

    def _fit(self) -> tuple[float, float]:
        # Units are normalised by their mean first, so that no cost scale overflows the squares.
        n = len(self._seen)
        scale = sum(x for x, _ in self._seen) / n
        xs = [x / scale for x, _ in self._seen]
        mean_y = sum(y for _, y in self._seen) / n
        var_x = sum((x - 1.0) ** 2 for x in xs) / n
        if var_x > 1e-9:
            slope = sum((x - 1.0) * (y - mean_y) for x, (_, y) in zip(xs, self._seen, strict=True)) / n / var_x
            intercept = mean_y - slope
            if slope > 0 and intercept >= 0:
                return intercept, slope / scale
        return 0.0, mean_y / scale


class Knee:
    """Seconds per unit of cost, by batch size in powers of two, and the largest group that paid.

    Group k holds batches of 2**k to 2**(k+1) - 1 items. After `samples` batches in the current
    group, the next group is allowed for a trial; it is kept when its seconds per unit are at least
    `min_gain` lower, else the trial ends and is tried again after `retry_after` batches (the card
    or the inputs may have changed), twice as long after each trial that failed, up to
    `MAX_RETRY_FACTOR` times: a trial of a size that does not pay costs throughput, and where
    batching never pays (the CPU) it should be tried ever more rarely. A smaller group that has
    become faster takes over at once.
    """

    def __init__(self, *, min_gain: float, samples: int = 3, retry_after: int = 50, max_group: int = 20) -> None:
        self.min_gain = min_gain
        self._samples = samples
        self._base_retry_after = retry_after
        self._retry_after = retry_after
        self._max_group = max_group
        self.group = 0
        self.trial = False
        self._spu: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._since_trial = 0

    @staticmethod
    def group_of(items: int) -> int:
        return max(0, items.bit_length() - 1)

    def max_items(self) -> int:
        group = self.group + 1 if self.trial else self.group
        return (1 << (group + 1)) - 1

    def observe(self, items: int, units: float, latency_s: float) -> None:
        if items <= 0 or units <= 0 or latency_s < 0:
            return
        group = self.group_of(items)
        spu = latency_s / units
        seen = self._count.get(group, 0)
        self._spu[group] = spu if seen == 0 else self._spu[group] + 0.3 * (spu - self._spu[group])
        self._count[group] = seen + 1
        self._since_trial += 1
        self._judge()

    def _ready(self, group: int) -> bool:
        return self._count.get(group, 0) >= self._samples

    def _judge(self) -> None:
        here, above, below = self.group, self.group + 1, self.group - 1
        if below >= 0 and self._ready(below) and self._ready(here):
            if self._spu[below] * (1 + self.min_gain) < self._spu[here]:
                self.group, self.trial = below, False
                return
        if self.trial and self._ready(above):
            paid = self._spu[above] <= self._spu[here] * (1 - self.min_gain)
            if paid:
                self.group = above
            self._retry_after = self._base_retry_after if paid else self._longer_retry()
            self.trial, self._since_trial = False, 0
        elif self.trial and self._since_trial > self._retry_after:
            self._retry_after = self._longer_retry()
            self.trial, self._since_trial = False, 0  # the trial size never ran (too little load, no room)
        elif not self.trial and self._ready(here) and above <= self._max_group:
            if above not in self._count or self._since_trial > self._retry_after:
                self._count.pop(above, None)  # a new trial judges on fresh batches
                self.trial, self._since_trial = True, 0

    def _longer_retry(self) -> int:
        return min(self._retry_after * 2, self._base_retry_after * MAX_RETRY_FACTOR)


class BatchPolicy:
    """The batch size in force, from readings, batch outcomes and OOMs, with the time passed in."""

    def __init__(
        self,
        *,
        max_batch_size: int | None = None,
        target_utilisation: float = 0.95,
        min_gain: float = 0.05,
        oom_hold_s: float = 10.0,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.target_utilisation = check_fraction("target_utilisation", target_utilisation)
        self.oom_hold_s = oom_hold_s
        self.bytes = ItemBytes()
        self.knee = Knee(min_gain=min_gain)
        self._used_bytes: float | None = None  # the latest reading with no batch of ours running
        self._total_bytes: float | None = None
        self._oom_units: float | None = None  # a batch this large ran out of memory...
        self._oom_room_bytes: float | None = None  # ...with this much room...
        self._oom_until_s = -math.inf  # ...and the size stays below it until then

    # -- observations ---------------------------------------------------------------------------

    def reading(self, now_s: float, used_bytes: int, total_bytes: int) -> None:
        """A reading taken with no batch of ours on the card: what everything else holds now."""
        self._used_bytes, self._total_bytes = float(used_bytes), float(total_bytes)
        room = self._room_bytes(1.0)
        if room is not None and self._oom_room_bytes is not None and room < self._oom_room_bytes:
            # Less room than the batch that ran out believed it had: a neighbour took it (readings
            # lag a neighbour's arrival), not larger items. The size hold stays; the bytes lesson goes.
            self.bytes.relax()
        self._expire_oom(now_s)

    def batch_done(
        self, now_s: float, *, items: int, units: float, latency_s: float, peak_used_bytes: int | None
    ) -> None:
        """A batch ran: `peak_used_bytes` is the highest reading while it ran (None: none was taken)."""
        self.knee.observe(items, units, latency_s)
        # A peak no higher than the reading before is a batch the watch missed (it read before the
        # batch allocated, or the batch was shorter than its period): no lesson, not "zero bytes".
        if peak_used_bytes is not None and self._used_bytes is not None and peak_used_bytes > self._used_bytes:
            self.bytes.observe(units, peak_used_bytes - self._used_bytes)
        self._expire_oom(now_s)

    def batch_oom(self, now_s: float, *, units: float) -> None:
        """A batch of `units` ran out of memory: hold below it, and learn that a unit takes more."""
        room = self._room_bytes(1.0)
        if room is not None:
            self.bytes.oom(units, room)
        self._oom_units = units if self._oom_units is None else min(self._oom_units, units)
        self._oom_room_bytes = room
        self._oom_until_s = now_s + self.oom_hold_s

    def _expire_oom(self, now_s: float) -> None:
        if self._oom_units is None:
            return
        room, estimate = self._room_bytes(1.0), self.bytes.estimate()
        grown = (
            room is not None
            and self._oom_room_bytes is not None
            and estimate is not None
            and room > self._oom_room_bytes + estimate[1]
        )
        if now_s >= self._oom_until_s or grown:
            self._oom_units = self._oom_room_bytes = None
            self.bytes.relax()

    # -- answers --------------------------------------------------------------------------------

    def _room_bytes(self, fraction: float) -> float | None:
        if self._used_bytes is None or self._total_bytes is None:
            return None
        return fraction * self._total_bytes - self._used_bytes

    def memory_units(self) -> float:
        """The units of cost that fit in the room under target now; `inf` while unknown."""
        room, estimate = self._room_bytes(self.target_utilisation), self.bytes.estimate()
        if room is None or estimate is None:
            return math.inf
        workspace, per_unit = estimate
        if per_unit <= 0:
            return math.inf
        units = max(0.0, (room - workspace) / per_unit)
        size = self.bytes.one_size()
        if size is not None and units > size:
            # Only batches of one size seen, and it fit with room to spare: their bytes were all put
            # on the units, so a large workspace would hold the size there for good. One more unit
            # is allowed (an OOM is split and retried cheaply), so sizes vary and the fit separates
            # the workspace from the bytes per unit.
            units = max(units, size + 1)
        return units

    def limits(self) -> BatchLimits:
        """The next batch's bounds (the first item always goes, whatever they say)."""
        items, bound = self.knee.max_items(), "knee"
        if self.max_batch_size is not None and self.max_batch_size < items:
            items, bound = self.max_batch_size, "max_batch_size"
        units = self.memory_units()
        if self._oom_units is not None and self._oom_units <= units:
            units, bound = math.nextafter(self._oom_units, 0.0), "oom"
        elif units < items:  # with unit costs: memory binds before the count does
            bound = "memory"
        return BatchLimits(items=max(1, items), units=units, bound=bound)

    def describe(self) -> dict[str, float | int | str | None]:
        estimate = self.bytes.estimate()
        return {
            "knee_max_items": self.knee.max_items(),
            "knee_trial": int(self.knee.trial),
            "memory_units": None if math.isinf(self.memory_units()) else round(self.memory_units(), 3),
            "workspace_bytes": None if estimate is None else round(estimate[0]),
            "bytes_per_unit": None if estimate is None else round(estimate[1]),
        }
