"""Out-of-memory errors the application caught itself, found in the probe's cumulative count.

PyTorch's `num_ooms` moves the moment the allocator raises; the error itself reaches the gate a
little later (out of the thread pool, out of a task group), if it reaches it at all. So an OOM in
the count is at first only pending: errors reported within `GRACE_S` explain it, and one still
unexplained after that was swallowed by the application. The grace is time, not a number of
readings: readings may come every few milliseconds, faster than an error travels. Errors the
count never sees (a runtime "CUDA error: out of memory", another device's) leave no debt behind,
and a count that goes down (statistics reset, another device) is a new starting point.
"""

from __future__ import annotations

from collections import deque

__all__ = ["GRACE_S", "SwallowedOoms"]

GRACE_S = 1.0


class SwallowedOoms:
    def __init__(self) -> None:
        self._last_count: int | None = None
        self._pending: deque[list[float]] = deque()  # [first seen at, how many not yet explained]
        self._errors = 0  # OOM errors reported by gated routes since the last reading

    def error_seen(self) -> None:
        self._errors += 1

    def reading(self, oom_count: int | None, now_s: float) -> int:
        """A new cumulative count at `now_s`: how many OOMs it shows that the application swallowed."""
        errors, self._errors = self._errors, 0
        if oom_count is None:
            return 0
        if self._last_count is None or oom_count < self._last_count:
            self._last_count = oom_count
            self._pending.clear()
            return 0
        if oom_count > self._last_count:
            self._pending.append([now_s, oom_count - self._last_count])
            self._last_count = oom_count
        pending = self._pending
        while errors and pending:  # the oldest first: their errors were on the way longest
            explained = min(errors, int(pending[0][1]))
            errors -= explained
            pending[0][1] -= explained
            if not pending[0][1]:
                pending.popleft()
        swallowed = 0
        while pending and now_s - pending[0][0] >= GRACE_S:
            swallowed += int(pending.popleft()[1])
        return swallowed
