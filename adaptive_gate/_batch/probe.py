"""The batcher's readings: one before each batch (what the card holds without it), and the highest
one while it runs (what it added). Both off the event loop.

Behind a gate (`controller=batched.gate_controller()`), the reading before a batch is taken by the
gate's sampler, on its thread and probe, at the batcher's request (`CardReader`): no probe thread of
the batcher's beside the gate's. Those readings go to the batcher alone; the gate's own keep their
random phase (a reading between two batches, every batch, would show an idle card under load).
Alone, the batcher reads its own probe through a `ProbeThread` of its own (a daemon thread, under a
timeout, no second call while one hangs). Readings while a batch runs come from `PeakWatch`, a
daemon thread that reads every `period_s` between `begin()` and `end()` and keeps the highest: a
batch is often shorter than the gate's sampling period, and its peak is what must fit; it reads the
gate's probe where there is a gate.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from .._observe.sampler import ProbeHung, ProbeThread
from ..memory import MemorySample, check_sample
from ..probes import Probe, auto_probe

__all__ = ["BatchProbe", "CardReader", "PeakWatch"]

READ_TIMEOUT_S = 1.0
START_TIMEOUT_S = 5.0  # NVML's start-up, or torch's first CUDA call


class PeakWatch:
    """Reads the probe every `period_s` while a batch runs; `end()` answers the highest used bytes."""

    def __init__(self, probe: Probe, period_s: float) -> None:
        self._probe = probe
        self._period_s = period_s
        self._condition = threading.Condition()
        self._running = False
        self._closed = False
        self._generation = 0
        self._peak: int | None = None
        self._thread: threading.Thread | None = None
        self._close_at_end = False

    def begin(self) -> None:
        with self._condition:
            self._running, self._peak = True, None
            self._generation += 1
            self._condition.notify()
        if self._thread is None:
            # A daemon: a probe that never answers must not keep the process alive. It waits on the
            # condition between batches and costs nothing then.
            self._thread = threading.Thread(target=self._serve, name="adaptive-gate-batch-peak", daemon=True)
            self._thread.start()

    def end(self) -> int | None:
        with self._condition:
            self._running = False
            if self._close_at_end:
                self._closed = True
                self._condition.notify()
            return self._peak

    def close(self) -> None:
        """The thread ends once the reading it takes (if any) returns."""
        with self._condition:
            if self._running:  # its batch still runs (a gate built meanwhile): that batch's peak is still wanted
                self._close_at_end = True
                return
            self._closed, self._running = True, False
            self._condition.notify()

    def _serve(self) -> None:
        while True:
            with self._condition:
                while not self._running and not self._closed:
                    self._condition.wait()
                if self._closed:
                    return
                generation = self._generation
            try:
                used: int | None = check_sample(self._probe.sample()).used_bytes
            except Exception:  # a failed reading teaches nothing; the batch runs on regardless
                used = None
            with self._condition:
                if used is not None and self._running and generation == self._generation:
                    self._peak = used if self._peak is None else max(self._peak, used)
            time.sleep(self._period_s)


class CardReader(Protocol):
    """The gate's sampler, as a batcher behind the gate reads the card through it."""

    @property
    def configured(self) -> Probe | str | None:
        """The gate's `probe` option: `"auto"`, None or a probe."""

    @property
    def probe(self) -> Probe | None:
        """The probe the gate's sampler reads, once it found one."""

    @property
    def alive(self) -> bool:
        """Whether its gate still exists (a gate dropped, or built again, leaves a dead reader)."""

    async def reading(self) -> MemorySample | None:
        """A reading taken from now on, or None (no probe, it failed, or the gate is not running)."""


class BatchProbe:
    """The probe a batcher was given (`"auto"` resolved on first use, off the loop) or the gate's
    sampler it reads through, its readings, and what went wrong with them, for the statistics."""

    def __init__(self, probe: Probe | str | None, period_s: float) -> None:
        self._period_s = period_s
        self._given = probe
        self.errors = 0
        self.last_error: str | None = None
        self.readers: list[CardReader] = []  # the gates' samplers, the first built first
        self._gate_watch: PeakWatch | None = None  # on the gate's probe, where it reads through a gate
        self._read_own()

    def _read_own(self) -> None:
        """Read the probe it was given, on a thread of its own (at the start, and once no gate is left)."""
        probe = self._given
        self._thread = ProbeThread()
        self._resolved = probe is None or not isinstance(probe, str)
        self.probe: Probe | None = None if isinstance(probe, str) else probe
        self.description = _describe(probe)
        self.watch: PeakWatch | None = None if self.probe is None else PeakWatch(self.probe, self._period_s)

    def read_through(self, reader: CardReader) -> None:
        """Read the card through a gate's sampler from now on: one view of the card, not two.

        A gate without a probe reads nothing, and a batcher told `probe=None` reads nothing either:
        each keeps what it was given. A batcher given a probe of its own behind a gate that reads
        another would hold a second view of the card: a mistake in the set-up, said at once. Where
        several gates were built with its controller (a middleware stack built again), the batch
        reads through the first whose sampler runs on the caller's loop.
        """
        self._forget_dead()
        given, configured = self._given, reader.configured
        if configured is None or given is None:
            return
        if not isinstance(given, str) and given is not configured:
            raise ValueError(
                f"the batcher was given probe={given!r} and the gate in front reads probe={configured!r}: two "
                "views of one card. Give the probe to the gate alone (AdaptiveGate(..., probe=...)) and leave the "
                "batcher's at \"auto\": behind the gate it reads the card through the gate's sampler"
            )
        if not self.readers:
            self.close()  # its own thread and watch: the gate's sampler and probe serve from now on
            self._resolved, self.probe, self.watch = True, None, None
            self.description = "probe: the gate's sampler"
        self.readers.append(reader)

    async def read(self) -> MemorySample | None:
        """A reading now, or None (no probe, or it failed: counted, and the batch runs without it)."""
        if self._forget_dead():
            return await self._read_through()
        if not self._resolved:
            await self._resolve()
            if self._forget_dead():  # a gate was built meanwhile
                return await self._read_through()
        if self.probe is None:
            return None
        try:
            return check_sample(await self._thread.call(self.probe.sample, READ_TIMEOUT_S))
        except Exception as exc:  # a hang (TimeoutError, ProbeHung) or a failure alike
            self._error(f"probe.sample() failed: {exc!r}")
            return None

    async def _resolve(self) -> None:
        # Resolved only once there is an answer: a leader cancelled while the probe starts must not
        # leave the batcher without one for good. Its start still runs in the probe's thread; the
        # next leader that finds it running (ProbeHung) goes without a reading and asks again later.
        thread = self._thread
        try:
            probe, description = await thread.call(auto_probe, START_TIMEOUT_S)
        except ProbeHung:
            return
        except Exception as exc:
            probe, description = None, f"probe: none, it failed to start: {exc!r}"
        if thread is not self._thread or self.readers:
            return  # a gate took over meanwhile (`read_through`): its sampler reads the card, not this probe
        self._resolved, self.probe, self.description = True, probe, description
        self.watch = None if probe is None else PeakWatch(probe, self._period_s)

    def _forget_dead(self) -> bool:
        """Drop the readers of gates that are gone; with none left, read its own probe again. Whether
        any reader is left."""
        if all(reader.alive for reader in self.readers):
            return bool(self.readers)
        self.readers = [reader for reader in self.readers if reader.alive]
        if not self.readers:
            self.close()
            self._gate_watch = None
            self._read_own()
        return bool(self.readers)

    async def _read_through(self) -> MemorySample | None:
        """A gate's reading. The peak watch reads that gate's probe, and only where the reading
        before the batch came: a probe that fails is the sampler's to retry, at its own pace, not
        every few milliseconds of a batch."""
        for reader in self.readers:
            sample = await reader.reading()
            probe = reader.probe
            if sample is None or probe is None:
                continue
            if probe is not self.probe:
                if self._gate_watch is not None:
                    self._gate_watch.close()
                self.probe, self._gate_watch = probe, PeakWatch(probe, self._period_s)
            self.watch = self._gate_watch
            return sample
        self.watch = None
        return None

    def close(self) -> None:
        """End both threads (`Batched` calls it once it is collected): nothing else would."""
        self._thread.close()
        for watch in (self.watch, self._gate_watch):
            if watch is not None:
                watch.close()  # twice is harmless: the same watch may be both

    def _error(self, message: str) -> None:
        self.errors += 1
        self.last_error = message


def _describe(probe: Probe | str | None) -> str:
    if probe is None:
        return "probe: none, batches sized by the knee and out-of-memory errors alone"
    if isinstance(probe, str):
        return "probe: auto, resolved at the first batch"
    return f"probe: {probe!r}"
