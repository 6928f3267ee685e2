"""Controllers: how many gated requests may run at once, learned from what the gate observes.

A controller is arithmetic on events: the gate feeds it what happened (a request finished, an OOM,
a memory sample with so many in flight) with the time, and reads `limit` back. No clock, no sleep,
no I/O: the simulator replays hours of traffic through it exactly.

`AIMD`, the default: where a probe reads memory, the limit is what one model of the card says fits
(`memory_model.MemoryModel`), and nothing else holds it lower; where memory is not read, additive
increase and multiplicative decrease on OOMs. Latency is not used: on a GPU it is flat until the
memory runs out, and where it moves it moves as often with the event loop as with concurrency.
"""

from __future__ import annotations

import math
from functools import partialmethod
from typing import Any, Protocol, runtime_checkable

from .._checks import check_fraction, check_real
from ..memory import MemorySample
from .memory_model import MemoryModel
from .oom_states import FIT_SLACK

__all__ = ["AIMD", "Controller", "Fixed", "MemoryModel"]

GiB = 2**30
UNDER_LOAD = 1 / 64  # a cost's quantum: under a bar, a budget stays this far under the slots that ran out
DOUBLING_S = 0.1  # with readings further apart than this, the limit may double once per so long
MAX_OOM_HOLD_S = 600.0  # without readings, the longest a level that ran out is held (a long quiet spell forgets it)
# In a mix, an OOM with no more than this share of the cap in flight is no pile-up of its large ones, which the
# tail plans for at the cap: the card changed (a neighbour came). It plans no heavier tail, and the slots it freed
# wait for the next reading.
PILE_UP_SHARE = 0.5


@runtime_checkable
class Controller(Protocol):
    """What the gate needs from a controller. `epoch` counts the cuts made so far. Optional, called
    where present: `units_changed()`, `costs_told()`, `on_tick(now_s=)`, `on_swallowed_oom(...)` (else
    `on_oom`), `allocation_failed(nbytes, units)`, `after_oom(in_flight)`, `oldest_in_flight(arrived_s)`,
    `heavier_before()` and the property `budget` (see `AIMD`'s, which has them all)."""

    @property
    def limit(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def reason(self) -> str: ...

    def bind(self, *, min_limit: int, max_limit: int, initial_limit: int | None) -> None: ...

    def on_success(self, *, now_s: float, latency_s: float, concurrency: float, demand: bool) -> None: ...

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: float) -> None: ...

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class _Bounds:
    """`min_limit`/`max_limit` as handed over by the gate, shared by every controller."""

    min_limit = 1
    max_limit = 1
    _bound = False
    # Whether it learns: what it learnt is one card's, seen through one gate, and a second gate (or a second
    # `simulate` run) would start from it and feed it another's readings. One that learns nothing (`Fixed`)
    # may serve several gates of the same bounds.
    _learns = False

    def _bind_bounds(self, min_limit: int, max_limit: int) -> None:
        if self._bound and self._learns:
            name = type(self).__name__
            raise RuntimeError(
                f"this {name} is already used by another gate (or an earlier simulate run), and carries what it "
                f"learnt there: give each its own, controller={name}()"
            )
        if self._bound and (min_limit, max_limit) != (self.min_limit, self.max_limit):
            raise RuntimeError(
                "this controller is already used by another gate with other bounds; give each gate its own"
            )
        self.min_limit, self.max_limit, self._bound = min_limit, max_limit, True

    def _clamp(self, value: int) -> int:
        return max(self.min_limit, min(self.max_limit, value))


class Fixed(_Bounds):
    """A fixed limit: the hand-tuned `Semaphore(N)`, for comparison and for users who know N."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"Fixed(limit) needs an int >= 1, got {limit!r}")
        self._wanted = limit
        self._limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def epoch(self) -> int:
        return 0

    @property
    def reason(self) -> str:
        return "fixed"

    def bind(self, *, min_limit: int, max_limit: int, initial_limit: int | None) -> None:
        self._bind_bounds(min_limit, max_limit)
        self._limit = self._clamp(self._wanted)

    def on_success(self, *, now_s: float, latency_s: float, concurrency: float, demand: bool) -> None:
        pass

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: float) -> None:
        pass

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"controller": "fixed", "bound": "controller"}


class AIMD(_Bounds):
    """The limit from one model of the card where memory is read; AIMD on OOMs where it is not.

    Knobs (all keyword arguments):

    * `memory=MemoryModel(target_utilisation=1.0)`: the model of the card; its one knob is how
      full the card may get (below 1, a margin the OOMs need not teach).
    * `increase_step=1`: without readings, added to the limit after a window of `limit` successes
      with demand waiting.
    * `slow_start=True`: without readings, until the first cut add `increase_step` per success
      instead (the limit doubles per window), so a big card is found in a few windows.
    * `oom_backoff=0.5`: without readings, the factor applied on an OOM, once per congestion event
      (errors from requests admitted before the last cut do not cut again).
    * `oom_hold_s=30.0`: without readings, how long the level that ran out is not grown into again;
      doubled at each further OOM there, up to ten minutes (`MAX_OOM_HOLD_S`).
    """

    _learns = True

    def __init__(
        self,
        *,
        memory: MemoryModel | None = None,
        increase_step: int = 1,
        slow_start: bool = True,
        oom_backoff: float = 0.5,
        oom_hold_s: float = 30.0,
    ) -> None:
        if isinstance(increase_step, bool) or not isinstance(increase_step, int) or increase_step < 1:
            raise ValueError(f"increase_step must be an int >= 1, got {increase_step!r}")
        self.increase_step = increase_step
        if not isinstance(slow_start, bool):
            raise TypeError(f"slow_start must be True or False, got {slow_start!r}")  # "no" read as True
        self.slow_start = slow_start
        self.oom_backoff = check_fraction("oom_backoff", oom_backoff, high=0.99)
        if not 0 <= check_real("oom_hold_s", oom_hold_s, "a number of seconds") <= MAX_OOM_HOLD_S:  # NaN too
            raise ValueError(f"oom_hold_s must be within [0, {MAX_OOM_HOLD_S:g}] seconds, got {oom_hold_s}")
        self.oom_hold_s = float(oom_hold_s)
        if memory is not None and not isinstance(memory, MemoryModel):
            raise TypeError(f"memory must be an adaptive_gate.memory_model.MemoryModel, got {memory!r}")
        self.memory = memory if memory is not None else MemoryModel()

        self._aimd_limit = 1
        self._limit = 1
        self._epoch = 0
        self._reason = "start"
        self._window_successes = 0
        self._in_slow_start = self.slow_start
        self._now_s = -math.inf  # the latest time an event carried
        self._last_reading_s = math.inf  # when the last reading came (none yet: no time since)
        # Without readings: the fewest in flight that ran out lately, until when, and for how long.
        self._held_from: int | None = None
        self._held_until_s = -math.inf
        self._hold_s = self.oom_hold_s
        self._last_oom_s = -math.inf
        self.ooms_seen = 0
        # The allocation the next `on_oom`'s error named (`allocation_failed`): bytes and units
        self._allocation: tuple[float, float] | None = None
        # Whether the last OOM was a mix's large ones meeting (`_piled_up`): `on_oom` decides, `after_oom` follows
        self._oom_piled_up = False
        # Until the next reading, the most the limit may be (None: no such hold), and why: "oom" after an
        # OOM (`after_oom`), "pressed" after the others rose into a full card (`MemoryModel.pressed`)
        self._until_reading: int | None = None
        self._until_reading_cause = "oom"
        self._limit_at_reading = 1  # the limit as the last reading left it

    # -- the protocol ---------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def reason(self) -> str:
        return self._reason

    @property
    def budget(self) -> float:
        """Optional in the protocol: the slots requests that weigh fractions of one may fill. Where the
        model sets the limit, the room it reads (4.7 where the limit shows 4: a floor to whole slots
        leaves part of one idle); under an OOM's bar, up to under the slots that ran out; else the limit."""
        room = self.memory.room()
        if room is None or self.memory.is_mix():
            return float(self._limit)
        wanted, bound = self._wanted()
        if wanted != self._limit or bound not in ("memory", "oom"):
            return float(self._limit)  # held lower (growing at most twofold a reading, the bounds)
        ceiling = room
        load = self.memory.ooms.barred_load(self._now_s, room) if bound == "oom" else None
        if load is not None:
            ceiling = min(room, load - UNDER_LOAD)
        if math.floor(ceiling + FIT_SLACK) != self._limit:
            return float(self._limit)
        return max(float(self._limit), ceiling)

    def bind(self, *, min_limit: int, max_limit: int, initial_limit: int | None) -> None:
        self._bind_bounds(min_limit, max_limit)
        self._aimd_limit = self._clamp(min_limit if initial_limit is None else initial_limit)
        self._update("start")

    def on_success(self, *, now_s: float, latency_s: float, concurrency: float, demand: bool) -> None:
        self._now_s = max(self._now_s, now_s)
        self.memory.mix_success()
        self.memory.served(latency_s)
        if (held := self._pressed_hold()) is not None:
            # What it frees may be the others' too: no refill till the next reading says where it went
            self._until_reading = max(self.min_limit, held - 1)
            self._update("memory")
        if not demand or self._reads_memory() or self.memory.learning:
            return  # the model decides; or memory is read but not understood yet: no blind growth
        self._window_successes += 1
        window = 1 if self._in_slow_start else self._aimd_limit
        if self._window_successes < window:
            return
        self._window_successes = 0
        grown = min(self.max_limit, self._aimd_limit + self.increase_step)
        if self._held_from is not None and grown >= self._held_from and now_s < self._held_until_s:
            return  # that level ran out of memory lately
        self._aimd_limit = grown
        self._update("slow start" if self._in_slow_start else "additive increase")

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: float, placed: bool = True) -> None:
        """An OOM while `in_flight` requests (the failed one included; units of `cost`) ran. Not
        `placed` (`on_swallowed_oom`: the app's own, seen in the probe's count, beside how many
        unknown): weaker evidence, forgotten sooner."""
        self._now_s = max(self._now_s, now_s)
        self.ooms_seen += 1
        level = max(self.min_limit + 1, math.ceil(in_flight))
        # What the hooks before it told of this OOM's request (never of a later one's)
        allocation, self._allocation = self._allocation, None
        if self._reads_memory():
            self.memory.failed(now_s)
            learned = allocation is not None and self.memory.learn_size(allocation[0], allocation[1], now_s)
            stray = allocation is not None and self.memory.explained_by_size(level, allocation[0], allocation[1])
            mix = self.memory.is_mix()
            self._oom_piled_up = mix and self._piled_up(in_flight)
            if epoch is not None and epoch < self._epoch:
                # Admitted before the last correction: the same pile-up, corrected already.
                return
            if placed and mix:
                if self._oom_piled_up:
                    self.memory.mix_oom()  # a mix's large ones meeting: plan for a heavier tail, no bar
                # else the card changed (a neighbour came): the next reading says how (`after_oom` holds till it)
            elif not learned:
                # The model said `level` fitted in the room the card had: it did not. Kept, with that
                # room, until the card reads roomier; briefly where the evidence is weaker (the app's
                # own OOM, or one its own request's size explains).
                placed, load = placed and not stray, max(in_flight, level - 1)
                self.memory.ooms.record(now_s, level, self.memory.room(), placed=placed, load=load)
            self._epoch += 1
            self._update("out of memory", at_most=self._limit)  # an OOM never raises the limit
            return
        if epoch is not None and epoch < self._epoch:
            return  # admitted under a limit already cut for this congestion event
        if now_s - self._last_oom_s > MAX_OOM_HOLD_S:
            self._held_from, self._hold_s = None, self.oom_hold_s  # a long quiet spell: start afresh
        if self._held_from is not None and level >= self._held_from:
            self._hold_s = min(MAX_OOM_HOLD_S, self._hold_s * 2)  # a known-bad level, again
        else:
            self._held_from, self._hold_s = level, self.oom_hold_s
        self._last_oom_s, self._held_until_s = now_s, now_s + self._hold_s
        cut_to = min(math.floor(self._limit * self.oom_backoff), self._limit - 1, level - 1)
        self._aimd_limit = max(self.min_limit, cut_to)
        self._in_slow_start = False
        self._window_successes = 0
        self._epoch += 1
        self._update("out of memory")

    on_swallowed_oom = partialmethod(on_oom, placed=False)  # optional in the protocol (`GateCore.sample`)

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None:
        self._now_s = max(self._now_s, now_s)
        # Grown from the limit the last reading set where a full card held refills back since: those
        # slots were the others' for a reading, not a lower fit
        grown_from = self._limit if self._pressed_hold() is None else max(self._limit, self._limit_at_reading)
        self._until_reading = None
        self.memory.add(now_s, in_flight, sample.used_bytes, sample.total_bytes, sample.allocated_bytes)
        if self.memory.pressed and in_flight >= 1:
            # The others rose into a full card: whatever our requests free may be theirs. A slot less
            # till a reading after one of ours finished (`MemoryModel.pressed`), and none refilled of
            # those ours free till the next (`on_success`).
            self._until_reading = max(self.min_limit, math.ceil(in_flight - 1e-9) - 1)
            self._until_reading_cause = "pressed"
        self._update("memory", at_most=self._most_after_reading(now_s, grown_from))
        self._limit_at_reading = self._limit

    def _most_after_reading(self, now_s: float, grown_from: int) -> int | None:
        """Up at most twofold a reading (twofold per `DOUBLING_S` where readings are further apart): the
        first readings are of few requests, and one small request of a mix read alone sizes the card
        for many."""
        since_s, self._last_reading_s = now_s - self._last_reading_s, now_s
        # Whole periods (a reading the loop delayed a little is one); 8 at most; the first has none.
        periods = math.floor(since_s / DOUBLING_S + 1e-6) if math.isfinite(since_s) else 1
        return grown_from << max(1, min(periods, 8))

    def after_oom(self, in_flight: float) -> None:
        """Optional in the protocol, after `on_oom`: the slots that stay in flight once the failed
        request has left. Where memory is read, the limit is at most that until the next reading: what
        took the failed request's room has not been read yet, and a slot refilled at once runs out too."""
        if not self._reads_memory():
            return
        if self._oom_piled_up:
            return  # a mix's large ones meeting (as `on_oom` judged it): the next reading explains nothing
        held = max(self.min_limit, math.floor(in_flight + 1e-9))
        if self._until_reading is None or held < self._until_reading:
            # Pressed still: what ours free goes on being the others' (`on_success` takes it back)
            self._until_reading = held
            if self._pressed_hold() is None:
                self._until_reading_cause = "oom"
        self._update("out of memory", at_most=self._limit)

    def _piled_up(self, in_flight: float) -> bool:
        """In a mix, whether an OOM with `in_flight` (the failed request included) is its large ones meeting,
        which the tail plans for at the cap: not with `PILE_UP_SHARE` of the cap or fewer in flight."""
        cap = self.memory.cap()
        return cap is None or in_flight > PILE_UP_SHARE * cap

    def allocation_failed(self, nbytes: float, units: float) -> bool:
        """Optional in the protocol, before `on_oom`: the OOM of a request of `units` named the
        allocation of `nbytes`. True where it never fits (`too_large`: no `on_oom` follows); else the
        `on_oom` that follows teaches the model its size (`MemoryModel.learn_size`)."""
        if self.memory.never_fits(nbytes):
            return True
        self._allocation = (nbytes, units)  # for the `on_oom` that follows, which carries the time
        return False

    def oldest_in_flight(self, arrived_s: float | None) -> None:
        """Optional in the protocol, before each reading: when the oldest request in flight arrived
        (None: none runs, or several routes are gated). See `MemoryModel.oldest_in_flight`."""
        self.memory.oldest_in_flight(arrived_s)

    def heavier_before(self) -> tuple[float, float] | None:
        """Optional in the protocol, after each reading: where the sizes shrank, since when, and how many
        slots a request that joined the line before then weighs (`MemoryModel.heavier_before`)."""
        return self.memory.heavier_before()

    def units_changed(self) -> None:
        """The gate weighs its routes anew (`GateCore.weigh`): a slot means another share of a request
        (`MemoryModel.units_changed`)."""
        self.memory.units_changed()

    def reshaped(self, per_slot_bytes: float) -> None:
        """Optional in the protocol: a `cost` weighs a part per request now (`MemoryModel.reshaped`)."""
        self.memory.reshaped(per_slot_bytes)

    def costs_told(self) -> None:
        """Optional in the protocol, once: a request came with a `cost` other than 1 (`MemoryModel.told`)."""
        self.memory.costs_told()

    def describe(self) -> dict[str, Any]:
        est = self.memory.estimate()
        room = self.memory.room()
        described: dict[str, Any] = {
            "controller": "aimd",
            "bound": self._active_bound(),
            "why": self._why(),
            "epoch": self._epoch,
            "aimd_limit": None if est is not None else self._aimd_limit,
            "oom": self.memory.ooms.describe(self._now_s, room),
            "memory_model": None,
        }
        if est is not None:
            described["memory_model"] = {
                "baseline_bytes": round(est.baseline_bytes),
                "per_request_bytes": round(est.per_request_bytes),
                "per_request_spread_bytes": round(est.spread_bytes),
                "total_bytes": est.total_bytes,
                "room": None if room is None else round(room, 2),
                "cap": self.memory.cap(self._now_s),
                "target_utilisation": self.memory.target_utilisation,
                "samples": self.memory.samples,
            }
        return described

    # -- internals ------------------------------------------------------------------------------

    def _reads_memory(self) -> bool:
        return self.memory.estimate() is not None

    def _pressed_hold(self) -> int | None:
        """The most the limit may be till the next reading because the others rose into a full card, or
        None where they did not."""
        return self._until_reading if self._until_reading_cause == "pressed" else None

    def _wanted(self) -> tuple[int, str]:
        """The limit before the bounds, and what sets it."""
        cap = self.memory.cap(self._now_s)
        if cap is None:
            return self._aimd_limit, "controller"
        if self._until_reading is not None and self._until_reading < cap:
            return self._until_reading, "oom" if self._until_reading_cause == "oom" else "memory"
        if self.memory.ooms.describe(self._now_s, self.memory.room()) is not None and cap == self._oom_cap():
            return cap, "oom"
        return cap, "memory"

    def _oom_cap(self) -> int | None:
        room = self.memory.room()
        barred = None if room is None else self.memory.ooms.barred_from(self._now_s, room)
        return None if barred is None else barred - 1

    def _active_bound(self) -> str:
        wanted, bound = self._wanted()
        if wanted >= self.max_limit:
            return "max_limit"
        if wanted <= self.min_limit and bound != "controller":
            return "min_limit"
        return bound

    def _why(self) -> str:
        """One line: why the limit is what it is, with the figures behind it."""
        bound = self._active_bound()
        est = self.memory.estimate()
        if est is None:
            if self.memory.learning:
                return f"reading memory: {self.memory.busy_samples} busy readings, no request's bytes seen yet"
            held = self._held_from is not None and self._now_s < self._held_until_s
            oom = f"; {self._held_from} ran out of memory, held until {self._held_until_s:.1f} s" if held else ""
            return f"AIMD on OOMs (memory not read): limit {self._aimd_limit}{oom}"
        room_gib = (self.memory.target_utilisation * est.total_bytes - est.baseline_bytes) / GiB
        figures = (
            f"{room_gib:.2f} GiB of room beside {est.baseline_bytes / GiB:.2f} GiB of others', "
            f"{est.per_request_bytes / GiB:.2f} GiB a request"
        )
        until = self._until_reading
        if until is not None and (until, bound) == self._wanted():
            cause = self._until_reading_cause
            if cause == "pressed":
                left = f"{until}, what ours free left to them till the next reading"
                return f"memory: the others rose into a full card: {left}; {figures}"
            return f"out of memory with {until} left in flight: no more until the next reading; {figures}"
        if bound == "oom":
            state = self.memory.ooms.describe(self._now_s, self.memory.room())
            assert state is not None
            level, age_s, room_then = state["level"], state["age_s"], state["room_then"]
            return f"{level} ran out of memory {age_s:.1f} s ago with room for {room_then}; {figures}"
        return f"{bound}: {figures}"

    def _update(self, reason: str, at_most: int | None = None) -> None:
        wanted = self._wanted()[0]
        if self._until_reading is not None:
            at_most = self._until_reading if at_most is None else min(at_most, self._until_reading)
        new_limit = self._clamp(wanted if at_most is None else min(wanted, at_most))
        if new_limit != self._limit:
            self._reason = reason
            self._limit = new_limit
