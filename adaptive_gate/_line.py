"""Waiting in line for a slot, while listening for the client to leave.

A request that waits keeps reading `receive()` (through its `Body`), so a client that disconnects
gives up its place at once instead of when a slot would have come. Cancelled from outside at any
point, the wait leaves nothing behind: neither a place in the line nor a slot granted meanwhile.
"""

from __future__ import annotations

import anyio

from ._body import Body, ReadOutcome
from .core import GateCore
from .limiter import Waiter

__all__ = ["wait_in_line"]

MIN_LOOK_S = 0.01  # a waiter's patience is looked at no more often than this


async def wait_in_line(core: GateCore, waiter: Waiter, body: Body, timeout_s: float) -> str:
    """Wait for `waiter`'s slot: "granted", "timeout", "left" (the client went away), or the reason
    the line gave up on it ("deadline": it could no longer finish in time; "evicted")."""
    if waiter.granted:
        return "granted"
    if waiter.refused is not None:
        return waiter.refused
    waiter._event = anyio.Event()
    stale = False
    try:
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(body.wait_for_disconnect, task_group.cancel_scope)
            stale = await _wait(core, waiter, timeout_s)
            task_group.cancel_scope.cancel()
    except BaseException:
        core.leave(waiter)  # the place, or a slot granted meanwhile, goes back
        raise
    if waiter.granted and body.outcome is not ReadOutcome.DISCONNECTED:
        return "granted"
    core.leave(waiter)  # gives back the slot if it came in the same instant
    if body.outcome is ReadOutcome.DISCONNECTED:
        return "left"
    return waiter.refused or ("deadline" if stale else "timeout")


async def _wait(core: GateCore, waiter: Waiter, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for the slot (or a refusal); True when given up early instead: it
    waited its patience while the queue stood. A waiter that joined before the queue stood has no
    patience in its deadline, and under newest first its turn may never come: it is looked at again
    once a patience has passed, and once a patience after that, while it waits."""
    assert waiter._event is not None
    end_s = anyio.current_time() + timeout_s
    look_every_s = max(MIN_LOOK_S, waiter.patience_s)
    while True:
        left_s = end_s - anyio.current_time()
        with anyio.move_on_after(min(left_s, look_every_s)):
            await waiter._event.wait()
        if waiter._event.is_set() or left_s <= look_every_s:
            return False
        if core.delay is not None and core.delay.overloaded:
            return True
