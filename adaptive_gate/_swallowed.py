"""Out-of-memory errors the application caught itself, found in the probe's cumulative count.

PyTorch's `num_ooms` moves the moment the allocator raises; the error itself reaches the gate a
little later (through the thread pool, out of a task group), if it reaches it at all. So an OOM in
the count is at first only pending: errors reported before the next reading explain it, and one
still unexplained a whole reading later was swallowed by the application. Errors the count never
sees (a runtime "CUDA error: out of memory", another device's) leave no debt behind, and a count
that goes down (statistics reset, another device) is a new starting point.
"""

from __future__ import annotations

__all__ = ["SwallowedOoms"]


class SwallowedOoms:
    def __init__(self) -> None:
        self._last_count: int | None = None
        self._pending = 0  # in the count since the last reading but one, not yet explained by an error
        self._errors = 0  # OOM errors reported by gated routes since the last reading

    def error_seen(self) -> None:
        self._errors += 1

    def reading(self, oom_count: int | None) -> int:
        """A new cumulative count: how many OOMs it shows that the application swallowed."""
        errors, self._errors = self._errors, 0
        if oom_count is None:
            return 0
        if self._last_count is None or oom_count < self._last_count:
            self._last_count, self._pending = oom_count, 0
            return 0
        new = oom_count - self._last_count
        self._last_count = oom_count
        explained = min(self._pending, errors)  # the older ones first: their errors were on the way
        swallowed = self._pending - explained
        self._pending = new - min(new, errors - explained)
        return swallowed
