"""The background loops: the one that reads the memory probe off the event loop, and the monitor.

A probe may raise (no driver, an NVML error) or hang (a wedged driver). Neither may reach the
service: each call runs in a worker thread under a timeout, on a private one-token thread limiter
so that a hung call pins one thread of ours, never a token of the pool that sync routes share.
After a failure the loop waits longer (exponential backoff), and it says what happened through
`on_error`, so the status can show it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import anyio.to_thread

from .memory import MemorySample
from .probes import Probe

logger = logging.getLogger("adaptive_gate")

MAX_BACKOFF_S = 5.0


class BackgroundLoop:
    """A loop the gate runs beside the application: started once, stopped from anywhere, at once."""

    def __init__(self) -> None:
        self._cancel_scope: anyio.CancelScope | None = None
        self._stopped = False
        self.running = False

    def stop(self) -> None:
        self._stopped = True
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    async def run(self) -> None:
        self.running = True
        try:
            with anyio.CancelScope() as scope:
                self._cancel_scope = scope
                if self._stopped:
                    scope.cancel()
                await self._body()
        finally:
            self.running = False
            self._cancel_scope = None

    async def _body(self) -> None:
        raise NotImplementedError


class Sampler(BackgroundLoop):
    def __init__(
        self,
        probe_factory: Callable[[], tuple[Probe | None, str]],
        *,
        period_s: float,
        timeout_s: float,
        on_probe: Callable[[Probe | None, str], None],
        on_sample: Callable[[MemorySample], None],
        on_error: Callable[[str], None],
    ) -> None:
        super().__init__()
        # Set after each reading is tried, then replaced; `_wake` cuts the wait before the next one.
        self._reading_done = anyio.Event()
        self._wake = anyio.Event()
        self._readings_started = 0
        self._readings_done = 0
        self._without_probe = False
        self._probe_factory = probe_factory
        self._period_s = period_s
        self._timeout_s = timeout_s
        self._on_probe = on_probe
        self._on_sample = on_sample
        self._on_error = on_error

    async def fresh_reading(self, timeout_s: float) -> None:
        """Take a reading now and wait until it was tried (at most `timeout_s`). The gate's start-up
        asks for one after the application's own start-up, so that it is taken with the model
        loaded and nothing in flight: the baseline is known before the first request."""
        if self._without_probe or self._stopped:
            return
        wanted = self._readings_started + 1  # one that starts from now on, not one under way
        self._wake.set()
        with anyio.move_on_after(timeout_s):
            while self._readings_done < wanted and not self._without_probe:
                await self._reading_done.wait()

    def _reading_tried(self) -> None:
        self._reading_done.set()
        self._reading_done = anyio.Event()

    async def _body(self) -> None:
        limiter = anyio.CapacityLimiter(1)
        probe = await self._start_probe(limiter)
        if probe is None:
            self._without_probe = True
            self._reading_tried()
            return
        await self._loop(probe, limiter)

    async def _start_probe(self, limiter: anyio.CapacityLimiter) -> Probe | None:
        try:
            probe, description = await anyio.to_thread.run_sync(
                self._probe_factory, limiter=limiter, abandon_on_cancel=True
            )
        except Exception as exc:
            probe, description = None, f"probe: none, it failed to start: {exc!r}"
        self._on_probe(probe, description)
        return probe

    async def _loop(self, probe: Probe, limiter: anyio.CapacityLimiter) -> None:
        delay_s = self._period_s
        while True:
            self._readings_started += 1
            try:
                with anyio.fail_after(self._timeout_s):
                    sample = await anyio.to_thread.run_sync(probe.sample, limiter=limiter, abandon_on_cancel=True)
                if not isinstance(sample, MemorySample):
                    raise TypeError(f"probe.sample() returned {type(sample).__name__}, not a MemorySample")
            except TimeoutError:
                self._on_error(f"probe.sample() did not answer within {self._timeout_s} s")
                delay_s = min(MAX_BACKOFF_S, delay_s * 2)
            except Exception as exc:
                self._on_error(f"probe.sample() failed: {exc!r}")
                delay_s = min(MAX_BACKOFF_S, delay_s * 2)
            else:
                self._on_sample(sample)
                delay_s = self._period_s
            self._readings_done = self._readings_started
            self._reading_tried()
            with anyio.move_on_after(delay_s):
                await self._wake.wait()
            self._wake = anyio.Event()


class Monitor(BackgroundLoop):
    """Wakes every `period_s` and reports how late it woke: a late wake-up is a blocked event loop.

    The same tick drives what the gate does on a clock: its history for the dashboard and the
    diagnostics that watch states over time, so none of that costs anything per request.
    """

    def __init__(self, *, period_s: float, on_tick: Callable[[float, float], None]) -> None:
        super().__init__()
        self._period_s = period_s
        self._on_tick = on_tick

    async def _body(self) -> None:
        while True:
            due_s = time.monotonic() + self._period_s
            await anyio.sleep(self._period_s)
            now_s = time.monotonic()
            try:
                self._on_tick(now_s, max(0.0, now_s - due_s))
            except Exception:  # a bug in bookkeeping must not stop the watch, nor reach the service
                logger.exception("adaptive_gate: the monitor's tick failed")
