"""The gate's background work, with one lifecycle however it is started.

Two loops run beside the application: the sampler (probe readings) and the monitor (loop lag,
history, diagnostics, the send watchdog). They run in one structured task group, entered by
`running()`, whoever enters it: the ASGI lifespan (the usual case), the first gated request where no
lifespan runs (`httpx.ASGITransport`, `TestClient` without `with`, `uvicorn --lifespan off`), or an
embedder's own `async with gate.running():`. In every case the first probe reading is taken before
the first request is admitted, so the gate knows the card's idle baseline from the start.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._observe.sampler import BackgroundLoop, Monitor, Sampler
from ..memory import MemorySample
from ..probes import Probe

__all__ = ["Background", "serve_lifespan"]

FIRST_READING_WAIT_S = 2.0  # plus probe_timeout: how long the start waits for the first reading


class Background:
    def __init__(
        self,
        *,
        make_sampler: Callable[[], Sampler[Any] | None],
        make_monitor: Callable[[], Monitor],
        first_reading_timeout_s: float,
    ) -> None:
        self._make_sampler = make_sampler
        self._make_monitor = make_monitor
        self._first_reading_timeout_s = first_reading_timeout_s
        self._sampler: Sampler[Any] | None = None
        self._loops: list[BackgroundLoop] = []
        # Set once the first reading was tried: from then on requests are admitted without a look here.
        self.ready = False
        self._ready_event: anyio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: anyio.Event | None = None

    @property
    def sampler_running(self) -> bool:
        return self._sampler is not None and self._sampler.running

    @asynccontextmanager
    async def running(self, *, first_reading: bool = True) -> AsyncIterator[None]:
        """Run the loops for the duration of the block. `first_reading=False` leaves the first
        reading to `first_reading()` (the lifespan takes it once the application has started).
        Where the loops already run (a lifespan, and an embedder's `running()` inside it), the
        block shares them rather than starting a second set that would overwrite the first."""
        if self._loops:
            yield
            return
        sampler = self._make_sampler()
        loops: list[BackgroundLoop] = [loop for loop in (sampler, self._make_monitor()) if loop is not None]
        self._sampler, self._loops, self.ready = sampler, loops, False
        error: BaseException | None = None
        try:
            async with anyio.create_task_group() as task_group:
                for loop in loops:
                    task_group.start_soon(loop.run)
                try:
                    if first_reading:
                        await self.first_reading()
                    yield
                except BaseException as exc:  # re-raised below, not wrapped in an ExceptionGroup
                    error = exc
                for loop in loops:
                    loop.stop()
        finally:
            self._sampler, self._loops, self.ready = None, [], False
        if error is not None:
            raise error

    async def first_reading(self) -> None:
        """Take a reading now (the model is loaded, nothing runs) and mark the gate ready."""
        if self._sampler is not None:
            await self._sampler.fresh_reading(self._first_reading_timeout_s)
        self.ready = True
        if self._ready_event is not None:
            self._ready_event.set()

    @property
    def probe(self) -> Probe | None:
        """The probe the sampler reads, while it runs."""
        sampler = self._sampler
        return None if sampler is None else sampler.probe

    async def read_now(self, timeout_s: float) -> MemorySample | None:
        """A reading on the sampler's thread now, where it runs (`Sampler.read_now`): what a batcher
        behind the gate asks for before each batch."""
        sampler = self._sampler
        return None if sampler is None else await sampler.read_now(timeout_s)

    def stop(self) -> None:
        for loop in self._loops:
            loop.stop()
        if self._stop is not None:
            self._stop.set()

    async def start_without_lifespan(self) -> None:
        """No lifespan ran: start the loops in a task of their own, and wait for the first reading.

        Only on asyncio, where a task can outlive the request that started it; elsewhere the gate
        runs on OOM and latency signals until a lifespan or `running()` starts it. A task left
        from another event loop (a test's, a `TestClient` without `with`) is replaced.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.ready = True
            return
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            self._ready_event, self._stop = anyio.Event(), anyio.Event()
            self._task = loop.create_task(self._serve_until_stopped(self._stop))
        ready_event = self._ready_event
        assert ready_event is not None
        with anyio.move_on_after(self._first_reading_timeout_s + 1.0):
            await ready_event.wait()
        self.ready = True

    async def _serve_until_stopped(self, stop: anyio.Event) -> None:
        async with self.running():
            await stop.wait()

    async def aclose(self) -> None:
        """Stop the loops started without a lifespan; nothing is left running afterwards."""
        self.stop()
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            await asyncio.wait([task])


async def serve_lifespan(app: ASGIApp, background: Background, scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI lifespan, with the background work running for its whole length; the first reading
    is taken once the application's own start-up is done (the model loaded, nothing in flight)."""

    async def receive_and_watch() -> Message:
        message = await receive()
        if message["type"] == "lifespan.shutdown":
            background.stop()
        return message

    async def send_when_measured(message: Message) -> None:
        if message["type"] == "lifespan.startup.complete":
            await background.first_reading()
        await send(message)

    async with background.running(first_reading=False):
        await app(scope, receive_and_watch, send_when_measured)
