"""What stands in front of the benchmark's app besides the gate: the crash simulator and the ceilings
(the oracle, which knows the future, and the reader, which reads the card knowing each request's bytes)."""

from __future__ import annotations

import math
import time
from typing import Protocol

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adaptive_gate.limiter import Limiter
from adaptive_gate.testing import SimulatedGPU

from .model import INFER_PATHS, GiB, Phase, Scenario, Size

__all__ = ["CrashSimulator", "OracleMiddleware", "ReaderMiddleware", "World", "header"]


class World(Protocol):
    """What the fronts read of a run (`harness.World`): its scenario, its card, its crashes, and
    where they put themselves so the run can find them."""

    scenario: Scenario
    gpu: SimulatedGPU
    down_until_s: float
    crashes: int
    oracle: OracleMiddleware | None
    reader: ReaderMiddleware | None


class CrashSimulator:
    """Outermost: while the worker is 'restarting', everything fails; so do requests it was serving."""

    def __init__(self, app: ASGIApp, *, world: World) -> None:
        self.app = app
        self.world = world

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.world.scenario.crash_s <= 0:
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
    drawn, a byte budget that knows each request's size (the gate's own limiter, counting GiB).
    First come, first served."""

    def __init__(self, app: ASGIApp, *, world: World) -> None:
        self.app = app
        self.world = world
        world.oracle = self
        self.counting = all(isinstance(phase.request_bytes, Size) for phase in world.scenario.phases)
        self.limiter = Limiter(1, max_queue=2**20)
        self.resize(world.scenario.phases[0])

    @property
    def limit(self) -> float:
        return self.limiter.limit if self.counting else math.nan

    def resize(self, phase: Phase) -> None:
        room_bytes = self.world.scenario.total_bytes - self.world.scenario.weights_bytes - phase.neighbour_bytes
        if self.counting:
            assert isinstance(phase.request_bytes, Size)
            self.limiter.set_limit(max(1, room_bytes // phase.request_bytes.nbytes), time.monotonic())
        else:
            set_room(self.limiter, room_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in INFER_PATHS:
            await self.app(scope, receive, send)
            return
        units = 1 if self.counting else int(header(scope, b"x-request-bytes")) / GiB
        await self.limiter.acquire(units=units)
        try:
            await self.app(scope, receive, send)
        finally:
            self.limiter.release(units, now_s=time.monotonic())


class ReaderMiddleware:
    """A byte budget in GiB resized from each reading of the card (`read`, at the gate's sample
    period), knowing each request's exact bytes: the room is the card less the others' bytes (the
    weights and what the neighbour holds then). The best any gate that reads the card can do; deaf
    to OOMs, as a semaphore is. First come, first served."""

    def __init__(self, app: ASGIApp, *, world: World) -> None:
        self.app = app
        self.world = world
        world.reader = self
        self.limiter = Limiter(1, max_queue=2**20)
        self.read()

    @property
    def limit(self) -> float:
        return math.nan  # GiB, not requests

    def read(self) -> None:
        scenario, gpu = self.world.scenario, self.world.gpu
        room_bytes = scenario.total_bytes - scenario.weights_bytes - gpu.neighbour_bytes
        set_room(self.limiter, room_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in INFER_PATHS:
            await self.app(scope, receive, send)
            return
        units = int(header(scope, b"x-request-bytes")) / GiB
        await self.limiter.acquire(units=units)
        try:
            await self.app(scope, receive, send)
        finally:
            self.limiter.release(units, now_s=time.monotonic())


def set_room(limiter: Limiter, room_bytes: int) -> None:
    """A byte budget counted in GiB, to the byte: floored to whole GiB, it left a request of the fit
    out on a small card."""
    room_gib = room_bytes / GiB
    limiter.set_limit(max(1, math.floor(room_gib)), time.monotonic(), budget=room_gib)


def header(scope: Scope, name: bytes) -> str:
    return next(value.decode() for key, value in scope["headers"] if key == name)
