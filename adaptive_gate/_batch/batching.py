"""The line of items waiting for a batch: who goes in the next one, and when it is due.

Loop-free, like the limiter's bookkeeping: `add`, `remove` (a caller that left), `due` and `take`
are plain methods on a FIFO, so they can be checked exhaustively (`tests/test_batch_assembly.py`)
and driven on virtual time by the benchmark; `batch.py` is the async layer on top.

A batch is due when the line holds as much as the next batch may take (by count, or by units of
cost), or when its oldest item has waited `max_wait_s`. `take` hands out the oldest items first,
as many as fit the bounds, and always at least one: an item larger than every bound still runs,
alone, so that it fails with its own error instead of waiting for ever.

`BatchStatistics`, the frozen snapshot `Batched.statistics()` answers, lives here too: plain data,
importable without the async layer; so do the checks of `batch()`'s options and of `cost(item)`.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .._checks import check_int, check_seconds

__all__ = [
    "MAX_UNITS",
    "MAX_WAIT_S",
    "MIN_UNITS",
    "Assembly",
    "BatchStatistics",
    "Entry",
    "check_options",
    "check_units",
]

T = TypeVar("T")

MAX_WAIT_S = 60.0  # a caller's item waits at most this long for company; longer is a hang, not a batch
MIN_UNITS, MAX_UNITS = 1e-9, float(2**40)  # what cost(item) may answer: the policy's arithmetic stays finite


@dataclass(eq=False)
class Entry(Generic[T]):
    """One caller's item, from `add` until its batch ran (or it left)."""

    item: T
    units: float
    arrived_s: float
    taken: bool = field(default=False)


@dataclass(frozen=True)
class BatchStatistics:
    """What `Batched.statistics()` answers: the size in force and what batching did so far."""

    batch_size: int  # items the next batch may hold (by count and, with unit costs, memory)
    batch_units: float | None  # units of cost it may hold by memory; None while unknown
    bound: str  # what sets the size: "knee", "memory", "oom" or "max_batch_size"
    queued: int
    running: int
    batches: int  # calls of the function that returned one result per item
    items: int  # items those calls answered
    splits: int  # batches split in halves after an out-of-memory error
    ooms: int  # items that failed alone with an out-of-memory error
    failed_items: int
    cancelled: int  # callers that left before their result
    wait_added_s_mean: float | None  # from an item's arrival to the start of its batch
    batch_items_mean: float | None
    probe: str
    probe_errors: int
    policy: dict[str, float | int | str | None]


class Assembly(Generic[T]):
    def __init__(self) -> None:
        self._line: deque[Entry[T]] = deque()
        self._units = 0.0

    def __len__(self) -> int:
        return len(self._line)

    @property
    def units(self) -> float:
        return self._units

    def first(self) -> Entry[T] | None:
        return self._line[0] if self._line else None

    def add(self, entry: Entry[T]) -> None:
        self._line.append(entry)
        self._units += entry.units

    def remove(self, entry: Entry[T]) -> bool:
        """Take a waiting entry out of the line; False if it is not there (taken, or never added)."""
        if entry.taken:
            return False
        try:
            self._line.remove(entry)
        except ValueError:
            return False
        self._units -= entry.units
        if not self._line:
            self._units = 0.0  # no float residue once the line is empty
        return True

    def full(self, max_items: int, max_units: float) -> bool:
        return len(self._line) >= max_items or (bool(self._line) and self._units >= max_units)

    def due_s(self, max_wait_s: float) -> float | None:
        """When the oldest item's wait runs out (None: the line is empty)."""
        first = self.first()
        return None if first is None else first.arrived_s + max_wait_s

    def due(self, now_s: float, *, max_items: int, max_units: float, max_wait_s: float) -> bool:
        due_s = self.due_s(max_wait_s)
        return due_s is not None and (now_s >= due_s or self.full(max_items, max_units))

    def take(self, max_items: int, max_units: float) -> list[Entry[T]]:
        """The oldest entries that fit `max_items` and `max_units`; at least one unless the line is empty."""
        batch: list[Entry[T]] = []
        units = 0.0
        while self._line and len(batch) < max(1, max_items):
            entry = self._line[0]
            if batch and units + entry.units > max_units:
                break
            self._line.popleft()
            entry.taken = True
            units += entry.units
            batch.append(entry)
        self._units = 0.0 if not self._line else self._units - units
        return batch


def check_options(max_wait_s: object, max_batch_size: object, probe: object, cost: object) -> float:
    """`batch()`'s arguments, checked the same whether it or `Batched(...)` gets them; `max_wait_s` back."""
    wait_s = check_seconds("max_wait_s", max_wait_s)
    if wait_s > MAX_WAIT_S:
        raise ValueError(
            f"max_wait_s must be at most {MAX_WAIT_S:g} seconds (it is how long a lone caller waits for company), "
            f"got {max_wait_s}"
        )
    if max_batch_size is not None:
        check_int("max_batch_size", max_batch_size, 1)
    if not (probe is None or probe == "auto" or (not isinstance(probe, str) and hasattr(probe, "sample"))):
        raise TypeError(f'probe must be "auto", None or an object with sample() -> MemorySample, got {probe!r}')
    if cost is not None and not callable(cost):
        raise TypeError(f"cost must be None or a callable (item) -> float, got {cost!r}")
    return wait_s


def check_units(units: object, item: object) -> float:
    """What `cost(item)` answered, if it is a number of units the policy can count with."""
    # Any real number (a numpy scalar: `np.prod(image.shape)`), as the gate's own cost hook takes
    value = float(units) if isinstance(units, numbers.Real) and not isinstance(units, bool) else math.nan
    if not MIN_UNITS <= value <= MAX_UNITS:
        raise ValueError(
            f"cost(item) must return a number in [{MIN_UNITS:g}, 2**40] (units of cost: pixels, tokens), "
            f"got {units!r} for {item!r}"
        )
    return value
