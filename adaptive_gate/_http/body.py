"""A gated request's body, read whole before the request may take a GPU slot.

The slot is for GPU work. Were it taken first, a client that sends its body at one byte a second
would hold it for as long as it likes, and sixty-four such clients would hold every slot of a warm
service. So the gate reads the body first, under three bounds: its size (`max_body_bytes`, else
413), the time it may take (the body timeout, and never past `queue_timeout`, else 408),
and the bytes all requests read but not yet admitted hold together (`max_buffered_bytes`, else the
queue counts as full). The messages read are replayed to the application in order.
"""

from __future__ import annotations

from collections import deque
from enum import Enum

import anyio
from starlette.types import Message, Receive, Scope

__all__ = ["Body", "BodyBudget", "ReadOutcome", "read_body", "request_head"]

DEADLINE_HEADER = b"x-envoy-expected-rq-timeout-ms"
HTTP_1 = ("1.1", "1.0")


class ReadOutcome(Enum):
    COMPLETE = "complete"
    DISCONNECTED = "disconnected"
    TIMED_OUT = "timed_out"
    TOO_LARGE = "too_large"
    BUFFER_FULL = "buffer_full"


class BodyBudget:
    """The bytes that requests read but not yet admitted may hold together."""

    __slots__ = ("max_bytes", "held_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held_bytes = 0

    def take(self, nbytes: int) -> bool:
        if self.held_bytes + nbytes > self.max_bytes:
            return False
        self.held_bytes += nbytes
        return True

    def give_back(self, nbytes: int) -> None:
        self.held_bytes -= nbytes


class Body:
    """The messages read so far; `receive` replays them to the application, then reads on."""

    __slots__ = ("_messages", "_receive", "nbytes", "outcome")

    def __init__(self, receive: Receive) -> None:
        self._messages: deque[Message] = deque()
        self._receive = receive
        self.nbytes = 0
        self.outcome = ReadOutcome.TIMED_OUT

    async def receive(self) -> Message:
        if self._messages:
            return self._messages.popleft()
        return await self._receive()

    async def wait_for_disconnect(self, cancel_scope: anyio.CancelScope) -> None:
        """While the request waits for a slot: a client that leaves cancels the wait at once."""
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.outcome = ReadOutcome.DISCONNECTED
                cancel_scope.cancel()
                return
            self._messages.append(message)  # nothing else is expected once the body is whole; kept all the same


def request_head(scope: Scope) -> tuple[float | None, int | None, bool]:
    """From one pass over the headers: the seconds the proxy in front expects the request to take, where
    it says (Envoy's header: its timer starts once it has the whole request, so from the end of the body),
    the body's announced length, and whether a body may come."""
    proxy_s: float | None = None
    length, chunked = None, False
    for name, value in scope["headers"]:
        if name == DEADLINE_HEADER:
            # Digits only (int() takes "1_000" and " 5"); more than 12 of them is past any
            # timeout we keep, and would overflow the float division. Malformed: ignored.
            if value.isdigit() and len(value) <= 12:
                proxy_s = int(value) / 1000
        elif name == b"content-length":
            length = int(value) if value.isdigit() and len(value) <= 18 else -1
        elif name == b"transfer-encoding":
            chunked = True
    # HTTP/1 says a request has a body only with one of those two headers; HTTP/2 and 3 need neither.
    has_body = chunked or length != 0 and (length is not None or scope.get("http_version") not in HTTP_1)
    return proxy_s, length, has_body


async def read_body(receive: Receive, *, max_body_bytes: int, budget: BodyBudget, timeout_s: float) -> Body:
    """Read until the last body message, a disconnect, or a bound; `outcome` says which.

    The timer starts with the second message: the first costs a slow client nothing to withhold
    (no slot, no buffer), and a body that comes whole in one message, as most do, needs none.

    Bytes taken from `budget` stay taken while the outcome is COMPLETE (the caller gives them back
    when the request is admitted or leaves); on every other outcome they are given back here.
    """
    body = Body(receive)
    first = await receive()  # most bodies arrive whole in the first message: no timer for those
    if first["type"] == "http.request" and not first.get("more_body", False):
        chunk_bytes = len(first.get("body", b""))
        if chunk_bytes <= max_body_bytes and budget.take(chunk_bytes):
            body.nbytes = chunk_bytes
            body._messages.append(first)
            body.outcome = ReadOutcome.COMPLETE
            return body
    body._messages.append(first)  # read again below, under the timer, with the bounds
    try:
        with anyio.move_on_after(timeout_s):
            body.outcome = await _read(body, max_body_bytes, budget)
    finally:  # cancelled from outside too: what was taken goes back
        if body.outcome is not ReadOutcome.COMPLETE:
            budget.give_back(body.nbytes)
            body.nbytes = 0
    return body


async def _read(body: Body, max_body_bytes: int, budget: BodyBudget) -> ReadOutcome:
    pending: Message | None = body._messages.popleft()
    while True:
        message = pending if pending is not None else await body._receive()
        pending = None
        if message["type"] == "http.disconnect":
            return ReadOutcome.DISCONNECTED
        chunk_bytes = len(message.get("body", b""))
        if body.nbytes + chunk_bytes > max_body_bytes:
            return ReadOutcome.TOO_LARGE
        if not budget.take(chunk_bytes):
            return ReadOutcome.BUFFER_FULL
        body.nbytes += chunk_bytes
        body._messages.append(message)
        if not message.get("more_body", False):
            return ReadOutcome.COMPLETE
