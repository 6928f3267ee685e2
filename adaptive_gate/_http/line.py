"""Waiting in line for a slot, while listening for the client to leave.

A request that waits keeps reading `receive()` (through its `Body`), so a client that disconnects
gives up its place at once instead of when a slot would have come. Cancelled from outside at any
point, the wait leaves nothing behind: neither a place in the line nor a slot granted meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from .._gate.core import GateCore
from .._gate.limiter import Waiter
from .._gate.reasons import Reason, Waited
from .body import Body, ReadOutcome

__all__ = ["wait_in_line"]


async def wait_in_line(
    core: GateCore, waiter: Waiter, body: Body, timeout_s: float, clock: Callable[[], float]
) -> Waited | Reason:
    """Wait up to `timeout_s` (its latest start) for `waiter`'s slot: what it came to, or the reason
    the line gave up on it (`DEADLINE`: it could no longer be served in time; `EVICTED`)."""
    if waiter.granted:
        return Waited.GRANTED
    if waiter.refused is not None:
        return waiter.refused
    waiter._event = anyio.Event()
    try:
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(body.wait_for_disconnect, task_group.cancel_scope)
            with anyio.move_on_after(timeout_s):
                await waiter._event.wait()
            task_group.cancel_scope.cancel()
    except BaseException:
        core.leave(waiter, clock())  # the place, or a slot granted meanwhile, goes back
        raise
    if waiter.granted and body.outcome is not ReadOutcome.DISCONNECTED:
        return Waited.GRANTED
    core.leave(waiter, clock())  # gives back the slot if it came in the same instant
    if body.outcome is ReadOutcome.DISCONNECTED:
        return Waited.LEFT
    return waiter.refused or Waited.TIMEOUT
