"""What stands in front of the benchmark's app besides the gate: the crash simulator and the oracle."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .model import Phase, Size

if TYPE_CHECKING:
    from .harness import World

__all__ = ["CrashSimulator", "OracleMiddleware", "header"]


class CrashSimulator:
    """Outermost: while the worker is 'restarting', everything fails; so do requests it was serving."""

    def __init__(self, app: ASGIApp, *, world: World) -> None:
        self.app = app
        self.world = world

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.world.scenario.crash_on_oom:
            await self.app(scope, receive, send)
            return
        if time.monotonic() < self.world.down_until_s:
            await JSONResponse({"detail": "worker restarting"}, 502)(scope, receive, send)
            return
        crashes_at_start = self.world.crashes
        replaced = False

        async def send_unless_crashed(message: Message) -> None:
            nonlocal replaced
            if self.world.crashes != crashes_at_start or replaced:
                if not replaced:
                    replaced = True
                    await JSONResponse({"detail": "worker died"}, 502)(scope, receive, send)
                return
            await send(message)

        try:
            await self.app(scope, receive, send_unless_crashed)
        except Exception:
            if self.world.crashes == crashes_at_start:
                raise
            if not replaced:
                await JSONResponse({"detail": "worker died"}, 502)(scope, receive, send)


class OracleMiddleware:
    """What an operator who knows the future would set, the very moment the card changes: where all
    requests have one size, a semaphore of exactly what fits (requests queued before the change
    count as the new size: the operator resizes a semaphore, not a byte budget); where sizes are
    drawn, a byte budget that knows each request's size. First come, first served."""

    def __init__(self, app: ASGIApp, *, world: World) -> None:
        self.app = app
        self.world = world
        world.oracle = self
        self.room_bytes = self._room_bytes(world.scenario.phases[0])
        self.committed_bytes = 0
        self.in_flight = 0
        self.line: deque[tuple[int, anyio.Event]] = deque()

    def _room_bytes(self, phase: Phase) -> int:
        return self.world.scenario.total_bytes - self.world.scenario.weights_bytes - phase.neighbour_bytes

    @property
    def limit(self) -> float:
        size = self.world.phase.request_bytes
        return self.room_bytes // size.nbytes if isinstance(size, Size) else math.nan

    def resize(self, phase: Phase) -> None:
        self.room_bytes = self._room_bytes(phase)
        self._hand_over()

    def _fits(self, nbytes: int) -> bool:
        size = self.world.phase.request_bytes
        if isinstance(size, Size):  # one size for all: a semaphore of what fits, whatever is queued
            return self.in_flight < self.limit
        return self.committed_bytes + nbytes <= self.room_bytes

    def _hand_over(self) -> None:
        while self.line and (self.in_flight == 0 or self._fits(self.line[0][0])):
            nbytes, event = self.line.popleft()
            self.committed_bytes += nbytes
            self.in_flight += 1
            event.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/infer":
            await self.app(scope, receive, send)
            return
        nbytes = int(header(scope, b"x-request-bytes"))
        entry = (nbytes, anyio.Event())
        self.line.append(entry)
        self._hand_over()
        try:
            await entry[1].wait()
        except BaseException:
            if entry in self.line:
                self.line.remove(entry)
                raise
            self._release(nbytes)
            raise
        try:
            await self.app(scope, receive, send)
        finally:
            self._release(nbytes)

    def _release(self, nbytes: int) -> None:
        self.committed_bytes -= nbytes
        self.in_flight -= 1
        self._hand_over()


def header(scope: Scope, name: bytes) -> str:
    return next(value.decode() for key, value in scope["headers"] if key == name)
