"""The background loops: the one that reads the memory probe off the event loop, and the monitor.

A probe may raise (no driver, an NVML error), hang (a wedged driver) or lie (NaN, more used than
the card holds). None of it may reach the service: each call runs on the probe's own daemon thread
under a timeout, never on a thread of the pool that sync routes share; a call that hangs pins that
one thread, and no second call starts until it returns (a new thread per retry would leak one
thread per period, and a hung non-daemon thread keeps the process from exiting after Ctrl-C).
A reading is checked before it is used. After a failure the loop waits longer (exponential
backoff) and says what happened through `on_error`, so the status can show it; a bug in what the
gate does with a reading is logged and counted the same way, and never ends the loop.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

from ..memory import MemorySample, check_sample
from ..probes import Probe

logger = logging.getLogger("adaptive_gate")

MAX_BACKOFF_S = 5.0
# How far each wait between readings strays from the period, either way, at random: readings at a
# fixed period lock in phase with requests of about that period (24 clients of 50 ms requests, read
# every 50 ms) and catch the same moment of their turnover reading after reading (requests admitted
# and not yet allocated), which reads as requests that shrank. At a random phase each reading is a
# fair sample of the card. The mean period stays `period_s`.
JITTER_SHARE = 0.25
# The first reading may need the driver's start-up (nvmlInit, a CUDA context): it gets longer.
START_TIMEOUT_FACTOR = 5.0

T = TypeVar("T")


class ProbeHung(Exception):
    """The previous call to the probe has not returned: no other call is started meanwhile."""

    def __init__(self, hung_s: float) -> None:
        super().__init__(f"the previous call has not returned after {hung_s:.1f} s")
        self.hung_s = hung_s


class _Outcome(Generic[T]):
    __slots__ = ("value", "error", "done")

    def __init__(self) -> None:
        self.value: T | None = None
        self.error: BaseException | None = None
        self.done = anyio.Event()


class ProbeThread:
    """One daemon thread that runs the probe's calls one at a time.

    The event loop waits for a call under a timeout; a call that overruns it is abandoned, not
    stopped (a thread cannot be), and until it returns, `call` refuses to start another one. The
    thread is a daemon so that a driver that never answers cannot keep the process alive.
    """

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.busy_since_s: float | None = None

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    def close(self) -> None:
        """The thread ends once the call it runs (if any) returns; no call starts another."""
        self._closed = True
        if self._thread is not None:
            self._calls.put(None)
            self._thread = None

    async def call(self, function: Callable[[], T], timeout_s: float) -> T:
        if self._closed:
            raise RuntimeError("the probe's thread is closed")
        if self.busy_since_s is not None:
            raise ProbeHung(time.monotonic() - self.busy_since_s)
        token = anyio.lowlevel.current_token()
        outcome: _Outcome[T] = _Outcome()

        def run() -> None:
            try:
                outcome.value = function()
            except BaseException as exc:  # handed to the waiting task, which decides
                outcome.error = exc
            finally:
                self.busy_since_s = None
                try:
                    anyio.from_thread.run_sync(outcome.done.set, token=token)
                except Exception:  # the event loop is gone: nobody waits for this answer any more
                    pass

        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="adaptive-gate-probe", daemon=True)
            self._thread.start()
        self.busy_since_s = time.monotonic()
        self._calls.put(run)
        with anyio.fail_after(timeout_s):
            await outcome.done.wait()
        if isinstance(outcome.error, Exception):
            raise outcome.error
        if outcome.error is not None:  # SystemExit or KeyboardInterrupt from a probe ends nothing of ours
            raise RuntimeError(f"the probe raised {outcome.error!r}")
        return outcome.value  # type: ignore[return-value]


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
        except Exception:  # a bug of ours: logged, and never a reason to end the app's lifespan
            logger.exception("adaptive_gate: a background loop failed and stopped")
        finally:
            self.running = False
            self._cancel_scope = None

    async def _body(self) -> None:
        raise NotImplementedError


@dataclass
class _Live:
    """The sampler's probe while it runs: its thread, the lock its calls take turns on, its loop."""

    probe: Probe
    thread: ProbeThread
    lock: anyio.Lock
    token: object  # the event loop the sampler runs on


class Sampler(BackgroundLoop, Generic[T]):
    """Reads the probe every `period_s` on average (`JITTER_SHARE`) on its own thread and hands each
    checked reading to `on_sample`, with what `alongside()` said just before and just after it, read
    on the same thread.

    `alongside` is the gate's requests in flight: a reading means something only beside the requests
    that held the card when it was taken. Read on the event loop once the reading arrives, they are
    the requests of another moment: a loop busy for 30 ms (a burst of retries, a second worker's
    CPU) has admitted and released whole requests meanwhile, and one model paired 6 GiB with four
    requests that held it with two. The two counts bracket the reading; they differ where a request
    came or went while the probe ran.
    """

    def __init__(
        self,
        probe_factory: Callable[[], tuple[Probe | None, str]],
        *,
        period_s: float,
        timeout_s: float,
        on_probe: Callable[[Probe | None, str], None],
        alongside: Callable[[], T],
        on_sample: Callable[[MemorySample, T, T], None],
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
        self._alongside = alongside
        self._on_sample = on_sample
        self._on_error = on_error
        self._random = random.Random()
        self._live: _Live | None = None
        self._backing_off = False  # the last periodic reading failed: none on demand till one succeeds

    @property
    def probe(self) -> Probe | None:
        """The probe the sampler reads while it runs (a batcher's peak watch reads it too)."""
        return None if self._live is None else self._live.probe

    async def read_now(self, timeout_s: float) -> MemorySample | None:
        """A reading taken now on the sampler's thread, for a caller on the sampler's loop (a batcher
        behind the gate, before each batch), apart from the periodic readings: it moves neither
        their schedule, whose random phase is what makes each a fair sample of the card, nor the
        gate's model. None at once where the probe does not run (starting, none, stopped, the loop
        ended), where the sampler backs off a failing probe (a batch every few milliseconds must not
        hurry it), or the caller is on another loop; None where it fails. It waits at most `timeout_s`
        for the periodic reading under way, then at most `timeout_s` for its own.

        Its own call is shielded: a caller cancelled meanwhile (a route that gave up) waits for the
        probe to answer (microseconds; at most the timeout), so that the thread is idle when the lock
        passes on. Cut short, it would leave the thread busy, and the next periodic reading would
        find a healthy probe "hung": an error, a backoff, no readings for the batcher till it cleared.
        """
        live = self._live
        if live is None or self._backing_off or live.token != anyio.lowlevel.current_token():
            return None
        acquired = False
        with anyio.move_on_after(timeout_s):
            await live.lock.acquire()
            acquired = True
        if not acquired:
            return None
        try:
            if self._live is not live:
                return None  # the sampler stopped while this waited: its thread is closed
            with anyio.CancelScope(shield=True):
                try:
                    return check_sample(await live.thread.call(live.probe.sample, timeout_s))
                except Exception:  # a failure, a hang: the periodic readings say so in the status
                    return None
            return None  # for the type checker: a scope may swallow what it cancels
        finally:
            live.lock.release()

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
        thread = ProbeThread()
        try:
            probe = await self._start_probe(thread)
            if probe is None:
                self._without_probe = True
                self._reading_tried()
                return
            self._live = _Live(probe, thread, anyio.Lock(), anyio.lowlevel.current_token())
            await self._loop(self._live)
        finally:
            self._live = None
            thread.close()

    async def _start_probe(self, thread: ProbeThread) -> Probe | None:
        """Find the probe (`probe="auto"` loads NVML or torch), retrying while that hangs."""
        delay_s = self._period_s
        while True:
            try:
                probe, description = await thread.call(self._probe_factory, self._timeout_s * START_TIMEOUT_FACTOR)
            except (TimeoutError, ProbeHung) as exc:
                self._on_error(f"the probe did not start: {_hang_message(exc, self._timeout_s * START_TIMEOUT_FACTOR)}")
            except Exception as exc:
                probe, description = None, f"probe: none, it failed to start: {exc!r}"
                break
            else:
                break
            # Counts as a reading tried: start-up does not wait on a probe that cannot start.
            self._readings_started += 1
            self._readings_done = self._readings_started
            self._reading_tried()
            delay_s = min(MAX_BACKOFF_S, delay_s * 2)
            await self._pause(delay_s)
        self._on_probe(probe, description)
        return probe

    async def _loop(self, live: _Live) -> None:
        delay_s = self._period_s
        while True:
            self._readings_started += 1
            try:
                async with live.lock:  # one call at a time on the probe's thread, the batcher's too
                    raw, before, after = await live.thread.call(partial(self._read, live.probe), self._timeout_s)
                sample = check_sample(raw)
            except (TimeoutError, ProbeHung) as exc:
                self._on_error(f"probe.sample() {_hang_message(exc, self._timeout_s)}")
                delay_s = min(MAX_BACKOFF_S, delay_s * 2)
            except Exception as exc:
                self._on_error(f"probe.sample() failed: {exc!r}")
                delay_s = min(MAX_BACKOFF_S, delay_s * 2)
            else:
                delay_s = self._period_s if self._use(sample, before, after) else min(MAX_BACKOFF_S, delay_s * 2)
            self._backing_off = delay_s != self._period_s
            self._readings_done = self._readings_started
            self._reading_tried()
            jitter = self._random.uniform(1 - JITTER_SHARE, 1 + JITTER_SHARE)
            await self._pause(delay_s * jitter if delay_s == self._period_s else delay_s)  # a backoff waits in full

    def _read(self, probe: Probe) -> tuple[MemorySample, T, T]:
        """On the probe's thread: the reading, bracketed by what `alongside()` says."""
        before = self._alongside()
        sample = probe.sample()
        return sample, before, self._alongside()

    def _use(self, sample: MemorySample, before: T, after: T) -> bool:
        try:
            self._on_sample(sample, before, after)
        except Exception as exc:  # a bug of ours, or a reading no check foresaw: never the end of the loop
            logger.exception("adaptive_gate: handling a probe reading failed")
            self._on_error(f"handling the reading {sample!r} failed: {exc!r}")
            return False
        return True

    async def _pause(self, delay_s: float) -> None:
        with anyio.move_on_after(delay_s):
            await self._wake.wait()
        self._wake = anyio.Event()


def _hang_message(exc: Exception, timeout_s: float) -> str:
    message = f"did not answer within {timeout_s} s"
    if isinstance(exc, ProbeHung):
        message += f" and has not returned after {exc.hung_s:.1f} s (no other call starts until it does)"
    return message


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
