"""`BatchCapacity`: a gate controller whose limit is what a batcher can take, counted in items.

With a batcher behind the gate, the gate's default controller would count requests as if each ran
on its own: it starts low and grows by one per window, so at first the batcher never sees more
than a few callers at once and no batch forms. This controller hands the gate the batcher's own
answer instead: the items of the batch that runs plus those of the next one filling
(`Batched.capacity()`), which follows the card as the batch size does. OOMs are the batcher's to
handle (it splits the batch); one item that does not fit alone still reaches the gate as an OOM,
a 503, and the batch size it left behind lowers the limit on the next event.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..memory import MemorySample
from .batching import BatchStatistics
from .probe import CardReader

__all__ = ["BatchCapacity"]


class Batcher(Protocol):
    """What the controller reads of a batcher (`adaptive_gate.batch.Batched`)."""

    def capacity(self) -> int: ...

    def statistics(self) -> BatchStatistics: ...

    def read_through(self, reader: CardReader) -> None: ...


class BatchCapacity:
    """`AdaptiveGate(app, controller=batched.gate_controller())`: the limit follows the batcher."""

    def __init__(self, batched: Batcher) -> None:
        self._batched = batched
        self.min_limit = 1
        self.max_limit = 1
        self._bound = False

    @property
    def limit(self) -> int:
        return max(self.min_limit, min(self.max_limit, self._batched.capacity()))

    @property
    def epoch(self) -> int:
        return 0

    @property
    def reason(self) -> str:
        """One line with the figures behind the limit (the status's `controller.why`, a limit change's reason)."""
        return _why(self._batched.statistics())

    def bind(self, *, min_limit: int, max_limit: int, initial_limit: int | None) -> None:
        if self._bound and (min_limit, max_limit) != (self.min_limit, self.max_limit):
            raise RuntimeError("this controller is already used by another gate with other bounds; give each its own")
        self.min_limit, self.max_limit, self._bound = min_limit, max_limit, True

    @property
    def batcher(self) -> Batcher:
        """The batcher whose capacity is the limit (the gate tells others behind it apart by it)."""
        return self._batched

    def read_through(self, reader: CardReader) -> None:
        """The gate hands over its sampler: the batcher reads the card through it (`BatchProbe`)."""
        self._batched.read_through(reader)

    def on_success(self, *, now_s: float, latency_s: float, concurrency: float, demand: bool) -> None:
        pass  # the batcher learns from its own batches; the limit is read from it

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: float) -> None:
        pass

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        """The gate's status shows these under its controller: the batching figures, in one place."""
        stats = self._batched.statistics()
        wait_s = stats.wait_added_s_mean
        batching = {
            "batch_size": stats.batch_size,
            "bound": stats.bound,
            "batches": stats.batches,
            "items": stats.items,
            "splits": stats.splits,
            "ooms": stats.ooms,
            "failed_items": stats.failed_items,
            "cancelled": stats.cancelled,
            "wait_added_ms_mean": None if wait_s is None else round(wait_s * 1000, 3),
            # What the batcher learned of its batches' bytes (None until it has)
            "workspace_bytes": stats.policy.get("workspace_bytes"),
            "bytes_per_unit": stats.policy.get("bytes_per_unit"),
            "probe": stats.probe,
        }
        return {"controller": "batch_capacity", "bound": "batcher", "why": _why(stats), "batching": batching}


def _why(stats: BatchStatistics) -> str:
    """The batch size, what bounds it, by memory the units that fit, and where the readings come from."""
    bound = stats.bound
    if bound == "memory" and stats.batch_units is not None:
        bound = f"memory: {stats.batch_units:g} units fit the room under the target"
    return f"batch capacity: twice a batch of {stats.batch_size} ({bound}; {stats.probe})"
