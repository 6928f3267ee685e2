"""One caller of a batched function (`Call`), and `run_to_end`: the batch that no cancellation stops.

A batch, once running, must end for all its callers even when its leader is cancelled (the work on
the card could not be stopped anyway, and the others wait for their results). An anyio shield keeps
out anyio's cancel scopes (and so trio's), but on asyncio a plain `task.cancel()` (what
`asyncio.wait_for` and `asyncio.timeout` do) passes through it. So on asyncio the batch runs in a task
of its own, which the leader awaits through `asyncio.shield` until it has ended; a cancellation
that arrived meanwhile is raised then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

import anyio

__all__ = ["Call", "run_to_end"]

T = TypeVar("T")
R = TypeVar("R")


class Call(Generic[T, R]):
    """One caller: its item, its answer once there is one, and the event that wakes it."""

    __slots__ = ("item", "entry", "wake", "done", "value", "error", "traceback", "started")

    def __init__(self, item: T) -> None:
        self.item = item
        self.entry: Any = None  # its `Entry` in the line, once added
        self.wake = anyio.Event()
        self.done = False
        self.value: R | None = None
        self.error: BaseException | None = None
        self.traceback: TracebackType | None = None
        self.started = False

    def answer(self, value: R | None, error: BaseException | None) -> None:
        if not self.done:
            self.done, self.value, self.error = True, value, error
            # One error may go to every caller of a batch: each raises it from the traceback it had
            # when it was answered, not from the one the caller before it grew.
            self.traceback = None if error is None else error.__traceback__
            self.wake.set()

    def result(self) -> R:
        if self.error is not None:
            error, traceback = self.error, self.traceback
            self.error = self.traceback = None  # an OOM kept alive pins its frames' tensors
            raise error.with_traceback(traceback)
        return cast(R, self.value)


def _on_asyncio() -> bool:
    try:
        return asyncio.current_task() is not None
    except RuntimeError:  # no asyncio loop runs in this thread: trio
        return False


async def run_to_end(function: Callable[[], Awaitable[None]]) -> None:
    """Await `function()` to its end; a cancellation of the caller meanwhile is raised once it ended."""
    cancelled: BaseException | None = None
    with anyio.CancelScope(shield=True):
        if not _on_asyncio():
            await function()
            return
        task = asyncio.ensure_future(function())
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError as exc:  # ours (the task's own ends the loop, and is raised below)
                cancelled = exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the leader's own cancellation is what it raises
        raise cancelled
    task.result()
