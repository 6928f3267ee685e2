"""`adaptive_gate.batch`: dynamic batching with a batch size sized from the card, learned as it runs.

Decorate a function that takes a list of items and returns one result per item, in order; each
caller then awaits a single item and gets its own result back:

    @adaptive_gate.batch()
    def classify(images: list[Tensor]) -> list[Label]: ...

    label = await classify(image)

An exception instance returned in an item's place is raised to that caller alone (an input that
cannot be handled); an exception the function raises goes to every caller of the batch.

Callers wait in a line. The first of them leads: it waits until the line holds as much as the next
batch may take or `max_wait_s` passed since the oldest item came, runs the batch (a sync function
in a worker thread, never on the event loop), hands every caller its result, and passes the lead
to the oldest caller still waiting. So one batch runs at a time, without a task of its own that
would need a lifespan to start it. No cancellation stops a running batch (`_batch/call.py`: `run_to_end`,
anyio's scopes and asyncio's `task.cancel()` alike): a leader cancelled meanwhile gets its
cancellation when the batch is over, and no other caller loses its batch for it (the work on the
card could not be stopped anyway). A caller cancelled while it waits leaves the line at once.

How large a batch may be is the answer of `BatchPolicy` (`_batch/policy.py`): what fits the card's room now,
what still buys throughput, and `max_batch_size`. A batch that runs out of memory is split in
halves, each retried, and the policy learns from it; an item that does not fit alone fails with
the out-of-memory error, which the gate in front turns into a 503, and teaches the policy nothing
(nor do the splits that led to it): one caller's input must not turn batching off for the rest.

A batched function belongs to one event loop at a time (its line is plain data, not locked): one
per process, as a service has. A caller from another loop while the line is in use gets a
RuntimeError that says so, instead of a hang.

Not `ray.serve.batch` or a queue with a consumer task: both need the batch size fixed in advance,
and a consumer task needs a lifespan to run in, which a decorator does not have.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from ._batch.batching import Assembly, BatchStatistics, Entry, check_options, check_units
from ._batch.call import Call, run_to_end
from ._batch.gate import BatchCapacity
from ._batch.policy import BatchPolicy
from ._batch.probe import BatchProbe, CardReader
from ._observe.gated import BATCHERS, BEHIND_A_GATE
from .oom import is_oom
from .probes import Probe

__all__ = ["BatchStatistics", "Batched", "batch"]

T = TypeVar("T")
R = TypeVar("R")

PEAK_PERIOD_S = 0.005


class Batched(Generic[T, R]):
    """The batched function: `await batched(item)`, `statistics()`, `capacity()`."""

    def __init__(
        self,
        function: Callable[[list[T]], Sequence[R]] | Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_wait_s: float,
        max_batch_size: int | None,
        probe: Probe | str | None,
        cost: Callable[[T], float] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.function = function
        self.is_async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
            getattr(function, "__call__", None)  # noqa: B004 (an object whose __call__ is async)
        )
        self.max_wait_s = check_options(max_wait_s, max_batch_size, probe, cost)
        self.policy = BatchPolicy(max_batch_size=max_batch_size)
        BATCHERS.made = True  # gated requests tell batchers their gate from now on (`BEHIND_A_GATE`)
        self._probe = BatchProbe(probe, PEAK_PERIOD_S)
        weakref.finalize(self, self._probe.close)  # its threads end with it
        self._cost = cost
        self._clock = clock
        self._line: Assembly[Call[T, R]] = Assembly()
        self._leader: Call[T, R] | None = None
        self._loop: anyio.lowlevel.EventLoopToken | None = None  # the loop whose callers use the line
        self._joining = threading.Lock()
        self._arrived = anyio.Event()
        self._running = 0
        self._counts = dict.fromkeys(("batches", "items", "splits", "ooms", "failed", "cancelled"), 0)
        self._waited_s = 0.0
        self._started = 0
        self.__name__ = getattr(function, "__name__", "batched")
        self.__doc__ = getattr(function, "__doc__", None)

    # -- callers --------------------------------------------------------------------------------

    async def __call__(self, item: T) -> R:
        behind = BEHIND_A_GATE.get()  # the gate in front, where there is one: it tells its own batcher apart
        if behind is not None:
            behind(self)
        call: Call[T, R] = Call(item)
        call.entry = Entry(call, self._units_of(item), self._clock())
        with self._joining:  # two threads' loops must not both find the line idle
            self._check_loop()
            self._line.add(call.entry)
            if self._leader is None:
                self._leader = call
            else:
                self._arrived.set()  # a leader waiting for its batch to fill looks again
        try:
            while not call.done:
                if self._leader is call:
                    await self._lead()
                else:
                    await call.wake.wait()
                    call.wake = anyio.Event()
        finally:
            if not call.done:
                self._leave(call)
        return call.result()

    def _check_loop(self) -> None:
        """The line is plain data of one event loop: another loop may use it only once it is idle."""
        loop = anyio.lowlevel.current_token()
        if self._loop is not None and self._loop != loop and (self._leader is not None or self._line):
            raise RuntimeError(
                f"adaptive_gate.batch: {self.__name__} is in use on another event loop; a batched function "
                "belongs to one event loop at a time (one per process): give each loop its own"
            )
        self._loop = loop

    def _units_of(self, item: T) -> float:
        if self._cost is None:
            return 1.0
        return check_units(self._cost(item), item)

    def _leave(self, call: Call[T, R]) -> None:
        """A caller cancelled before its answer: out of the line (its batch, if one runs, goes on)."""
        self._counts["cancelled"] += 1
        if call.entry is not None:
            self._line.remove(call.entry)
        if self._leader is call:
            self._pass_lead()

    def _pass_lead(self) -> None:
        first = self._line.first()
        self._leader = None if first is None else first.item
        if first is not None:
            first.item.wake.set()

    # -- the leader -----------------------------------------------------------------------------

    async def _lead(self) -> None:
        await self._wait_for_batch()
        await self._read()
        limits = self.policy.limits()
        entries = self._line.take(limits.items, limits.units)
        try:
            await run_to_end(lambda: self._execute(entries))
        finally:
            unanswered = [entry for entry in entries if not entry.item.done]  # nobody waits for ever
            self._fail(unanswered, RuntimeError("adaptive_gate.batch: the batch ended without an answer"))
            self._pass_lead()

    async def _wait_for_batch(self) -> None:
        while True:
            limits, now_s = self.policy.limits(), self._clock()
            if self._line.due(now_s, max_items=limits.items, max_units=limits.units, max_wait_s=self.max_wait_s):
                return
            due_s = self._line.due_s(self.max_wait_s)
            assert due_s is not None  # the leader's own item is in the line
            self._arrived = anyio.Event()
            with anyio.move_on_after(due_s - now_s):
                await self._arrived.wait()

    async def _read(self) -> None:
        sample = await self._probe.read()
        if sample is not None:
            self.policy.reading(self._clock(), sample.used_bytes, sample.total_bytes)

    async def _execute(self, entries: list[Entry[Call[T, R]]]) -> None:
        """Run the batch; on an OOM, its halves one after the other, each after a fresh reading."""
        parts, fresh = [entries], True
        split_units: list[float] = []  # parts that ran out of memory and were split
        failed_alone = self._counts["ooms"]
        while parts:
            part = parts.pop()
            if not fresh:
                await self._read()
            fresh = False
            halves = await self._run(part)
            if halves:
                split_units.append(sum(entry.units for entry in part))
            parts.extend(reversed(halves))  # the older half first
        # An item that ran out of memory alone says nothing of the batch size (else one hostile caller
        # could keep batching off): the splits that led to it teach only where no item failed alone.
        if split_units and self._counts["ooms"] == failed_alone:
            self.policy.batch_oom(self._clock(), units=min(split_units))

    async def _run(self, part: list[Entry[Call[T, R]]]) -> list[list[Entry[Call[T, R]]]]:
        """One call of the function; the halves to retry when it ran out of memory, else []."""
        units = sum(entry.units for entry in part)
        started_s = self._clock()
        self._note_start(part, started_s)
        watch = self._probe.watch
        if watch is not None:
            watch.begin()
        self._running = len(part)
        try:
            results: Any = await self._invoke([entry.item.item for entry in part])
        except Exception as exc:
            peak = watch.end() if watch is not None else None
            self._running = 0
            oom = is_oom(exc)
            if not oom or len(part) == 1:
                self._counts["ooms"] += oom
                self._fail(part, exc)  # the whole batch's error, or the OOM of an item too large alone
                return []
            del exc, peak  # a live OOM pins the tensors that ran out: let it go before retrying
            self._counts["splits"] += 1
            middle = len(part) // 2
            return [part[:middle], part[middle:]]
        peak = watch.end() if watch is not None else None
        self._running = 0
        latency_s = self._clock() - started_s
        self.policy.batch_done(self._clock(), items=len(part), units=units, latency_s=latency_s, peak_used_bytes=peak)
        self._deliver(part, results)
        return []

    async def _invoke(self, items: list[T]) -> Any:
        if self.is_async:
            return await cast(Callable[[list[T]], Awaitable[Sequence[R]]], self.function)(items)
        return await anyio.to_thread.run_sync(cast(Callable[[list[T]], Sequence[R]], self.function), items)

    def _note_start(self, part: list[Entry[Call[T, R]]], started_s: float) -> None:
        for entry in part:
            if not entry.item.started:
                entry.item.started = True
                self._waited_s += started_s - entry.arrived_s
                self._started += 1

    def _fail(self, part: list[Entry[Call[T, R]]], error: BaseException) -> None:
        self._counts["failed"] += len(part)
        for entry in part:
            entry.item.answer(None, error)

    def _deliver(self, part: list[Entry[Call[T, R]]], results: Any) -> None:
        name = self.__name__
        if not isinstance(results, Sequence) or isinstance(results, str | bytes):
            self._fail(part, TypeError(f"{name} returned {type(results).__name__}; a batched function must "
                                       "return a list with one result per item, in order"))  # fmt: skip
            return
        if len(results) != len(part):
            self._fail(part, TypeError(f"{name} returned {len(results)} results for {len(part)} items; a batched "
                                       "function must return one result per item, in order"))  # fmt: skip
            return
        self._counts["batches"] += 1
        self._counts["items"] += len(part)
        for entry, result in zip(part, results, strict=True):
            if isinstance(result, BaseException):
                self._counts["failed"] += 1
                entry.item.answer(None, result)
            else:
                entry.item.answer(result, None)

    # -- status ---------------------------------------------------------------------------------

    def statistics(self) -> BatchStatistics:
        limits = self.policy.limits()
        counts = self._counts
        return BatchStatistics(
            batch_size=self._batch_size(),
            batch_units=None if math.isinf(limits.units) else round(limits.units, 3),
            bound=limits.bound,
            queued=len(self._line),
            running=self._running,
            batches=counts["batches"],
            items=counts["items"],
            splits=counts["splits"],
            ooms=counts["ooms"],
            failed_items=counts["failed"],
            cancelled=counts["cancelled"],
            wait_added_s_mean=self._waited_s / self._started if self._started else None,
            batch_items_mean=counts["items"] / counts["batches"] if counts["batches"] else None,
            probe=self._probe.description,
            probe_errors=self._probe.errors,
            policy=self.policy.describe(),
        )

    def _batch_size(self) -> int:
        """Items the next batch may hold: by count, and with unit costs by memory too."""
        limits = self.policy.limits()
        if self._cost is None and math.isfinite(limits.units):
            return min(limits.items, max(1, math.floor(limits.units)))
        return limits.items

    def capacity(self) -> int:
        """Items worth admitting at once: the batch that runs and the next one filling."""
        return 2 * self._batch_size()

    def read_through(self, reader: CardReader) -> None:
        """Read the card through the gate's sampler (the gate calls it with `gate_controller()`)."""
        self._probe.read_through(reader)

    def gate_controller(self) -> BatchCapacity:
        """A controller for the `AdaptiveGate` in front: its limit is `capacity()`, so batches form."""
        return BatchCapacity(self)


def batch(
    function: object = None,
    /,
    *,
    max_wait_s: float = 0.005,
    max_batch_size: int | None = None,
    probe: Probe | str | None = "auto",
    cost: Callable[[Any], float] | None = None,
) -> Callable[[Callable[[list[Any]], Any]], Batched[Any, Any]]:
    """Batch calls to `def f(items: list[T]) -> list[R]` (or its `async def`); see the module's docstring."""
    if function is not None:
        raise TypeError("batch takes its options by keyword: write @adaptive_gate.batch() with the parentheses")
    check_options(max_wait_s, max_batch_size, probe, cost)

    def decorate(function: Callable[[list[Any]], Any]) -> Batched[Any, Any]:
        if not callable(function):
            raise TypeError(f"@batch() decorates a function of a list of items, got {function!r}")
        return Batched(function, max_wait_s=max_wait_s, max_batch_size=max_batch_size, probe=probe, cost=cost)

    return decorate
