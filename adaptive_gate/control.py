"""Controllers: how many gated requests may run at once, learned from what the gate observes.

A controller is arithmetic on events. It never reads a clock, sleeps or does I/O: the gate feeds it
what happened (a request finished after so many seconds, an out-of-memory error, a memory sample
taken with so many requests in flight) together with the time, and reads `limit` back. This is what
lets the simulator in the tests replay hours of traffic in a fraction of a second, exactly.

`AIMD`, the default, combines three bounds and takes the smallest:

* an AIMD limit: +1 per window of `limit` successful requests while there is real demand, a deep
  multiplicative cut on an out-of-memory error, a gentle one when memory crosses a high watermark;
* a memory cap, learned online (`memory_model.MemoryModel`): the idle baseline and the bytes each
  request adds, and so how many fit under `target_utilisation` of the card (the "measure one
  request's increment" recipe, done continuously);
* `max_limit`.

Latency is used only as a brake on growth (stop where more concurrency no longer buys throughput),
never as the overload signal: on a GPU, latency is often flat until the memory runs out. The OOM
hold and the latency brake are small pieces of their own (`_brakes`) that AIMD composes.
"""

from __future__ import annotations

import math
from functools import partialmethod
from typing import Any, Protocol, runtime_checkable

from ._brakes import KneeBrake, KneeVerdict, OomHold
from ._checks import check_fraction
from ._oom_budget import OomBudget
from .memory import MemorySample
from .memory_model import MemoryModel

__all__ = ["AIMD", "Controller", "Fixed", "MemoryModel"]


@runtime_checkable
class Controller(Protocol):
    """What the gate needs from a controller. `epoch` counts the cuts made so far. Optional, called
    where present: `units_changed()`, `on_tick(now_s=)`, `on_swallowed_oom(...)` (else `on_oom`)."""

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

    def _bind_bounds(self, min_limit: int, max_limit: int) -> None:
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
    """Additive increase, multiplicative decrease, under a learned memory cap.

    Knobs (all keyword arguments):

    * `increase_step=1`: added to the limit after a window of `limit` successes with demand waiting.
    * `slow_start=True`: until the first cut, add `increase_step` per success instead (the limit
      doubles per window), so a big card is found in a few windows.
    * `oom_backoff=0.5`: factor applied on an out-of-memory error where memory is not read, at most
      once per congestion event (errors from requests admitted before the last cut are counted but
      do not cut again). Where it is read, an OOM cuts to one below the level that ran out and
      leaves the rest to the memory cap, which the next reading corrects.
    * `pressure_backoff=0.9`, `high_watermark=0.98`, `pressure_cooldown_s=1.0`: a gentle cut when a
      memory sample shows more than `high_watermark` of the card used, at most once per cooldown;
      no growth while above it.
    * `memory=MemoryModel(target_utilisation=0.97, halflife_s=5.0)`: the memory cap's model; its
      knobs are its own (how full the card may get, how fast it forgets).
    * `knee_gain=0.5`: growth needs at least this fraction of the ideal throughput gain of one more
      concurrent request, judged from latency at each (mean) concurrency; where a growth step fell
      short it is taken back and not retried for `knee_memory_s=30.0`, after which old latency is
      forgotten too, so the brake cannot stick. 0 turns the latency brake off.
    * `oom_hold_s=30.0`: after an OOM with N requests in flight, the limit goes below N and does
      not climb back to N while the card is as tight as it was then: where memory is read, until
      the readings show room for half a request more than at the OOM (at most `max_oom_hold_s`);
      where it is not, for `oom_hold_s`, doubled at each further OOM at N or more, up to
      `max_oom_hold_s=600.0`.
    * `oom_budget=0.1`: for sizes it cannot tell apart, a level whose OOMs after its first stay
      within this share of its requests keeps them uncut; one over it is not grown into (`_oom_budget`:
      how a change of the card is told from the mix). 0: every OOM cuts, as with one size.
    """

    def __init__(
        self,
        *,
        increase_step: int = 1,
        slow_start: bool = True,
        oom_backoff: float = 0.5,
        pressure_backoff: float = 0.9,
        high_watermark: float = 0.98,
        pressure_cooldown_s: float = 1.0,
        memory: MemoryModel | None = None,
        knee_gain: float = 0.5,
        knee_memory_s: float = 30.0,
        oom_hold_s: float = 30.0,
        max_oom_hold_s: float = 600.0,
        oom_budget: float = 0.1,
    ) -> None:
        if isinstance(increase_step, bool) or not isinstance(increase_step, int) or increase_step < 1:
            raise ValueError(f"increase_step must be an int >= 1, got {increase_step!r}")
        self.increase_step = increase_step
        self.slow_start = bool(slow_start)
        self.oom_backoff = check_fraction("oom_backoff", oom_backoff, high=0.99)
        self.pressure_backoff = check_fraction("pressure_backoff", pressure_backoff, high=0.99)
        self.high_watermark = check_fraction("high_watermark", high_watermark)
        if pressure_cooldown_s < 0:
            raise ValueError(f"pressure_cooldown_s must be >= 0, got {pressure_cooldown_s}")
        self.pressure_cooldown_s = float(pressure_cooldown_s)
        if memory is not None and not isinstance(memory, MemoryModel):
            raise TypeError(f"memory must be an adaptive_gate.memory_model.MemoryModel, got {memory!r}")
        self.memory = memory if memory is not None else MemoryModel()
        self.knee = KneeBrake(knee_gain=knee_gain, memory_s=knee_memory_s)
        self.oom_hold = OomHold(hold_s=oom_hold_s, max_hold_s=max_oom_hold_s)
        self.oom_budget = OomBudget(budget=oom_budget, memory_s=knee_memory_s)

        self._aimd_limit = 1
        self._limit = 1
        self._epoch = 0
        self._reason = "start"
        self._window_successes = 0
        self._in_slow_start = self.slow_start
        self._over_watermark = False
        self._last_pressure_cut_s = -math.inf
        self._grown_to: int | None = None  # the last growth step, which the knee brake may take back
        self.ooms_seen = 0

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

    def bind(self, *, min_limit: int, max_limit: int, initial_limit: int | None) -> None:
        self._bind_bounds(min_limit, max_limit)
        self._aimd_limit = self._clamp(min_limit if initial_limit is None else initial_limit)
        self._update("start")

    def on_success(self, *, now_s: float, latency_s: float, concurrency: float, demand: bool) -> None:
        self.knee.record(max(1, round(concurrency)), latency_s, now_s)
        self.oom_budget.answered(concurrency, now_s)
        if not demand or self._over_watermark:
            return
        if self._aimd_limit > self._limit:
            return  # another bound holds the limit: growing the AIMD part would only creep
        if self.memory.learning:
            return  # memory is measured but not understood yet: one busy sample more, then grow
        self._window_successes += 1
        window = 1 if self._in_slow_start else self._aimd_limit
        if self._window_successes < window:
            return
        self._window_successes = 0
        self._end_of_window(now_s)

    def _end_of_window(self, now_s: float) -> None:
        verdict = self.knee.judge(self._aimd_limit, now_s)
        if verdict is KneeVerdict.BRAKE:
            # More at once bought no throughput, only latency, window after window: hold off growing
            # there a while, and if growth got us here, take that step back (a brake, never a cut).
            self._in_slow_start = False
            if self._grown_to == self._aimd_limit:
                self._aimd_limit = max(self.min_limit, self._aimd_limit - 1)
                self._update("throughput knee")
            self._grown_to = None
            return
        if verdict is KneeVerdict.WAIT:
            return
        grown = min(self.max_limit, self._aimd_limit + self.increase_step)
        if self._barred(grown, now_s):
            return
        self._aimd_limit = self._grown_to = grown
        self._update("slow start" if self._in_slow_start else "additive increase")

    def _barred(self, level: int, now_s: float) -> bool:
        """Whether `level` ran out of memory, or bought nothing, lately. An OOM's hold gives way
        where every level grown through has since run within the budget (a mix's levels, not a
        change of the card)."""
        budget, room = self.oom_budget, self.memory.room()
        held = self.oom_hold.bars(level, now_s, room) and not all(
            budget.within(through, now_s) for through in range(self._aimd_limit + 1, level + 1)
        )
        return held or budget.bars(level, now_s, room) or self.knee.bars(level, now_s)

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: float, placed: bool = True) -> None:
        """An OOM while `in_flight` requests (the failed one included; units of `cost`) ran. Not
        `placed` (`on_swallowed_oom`: the app's own, seen in the probe's count, beside how many
        unknown): they cut as one, and are never kept for the budget."""
        self.ooms_seen += 1
        room = self.memory.room()
        ran_out_at = max(self.min_limit + 1, math.ceil(in_flight))
        if placed and self.oom_budget.ran_out(max(1, math.ceil(in_flight)), now_s, room):
            return  # a pile-up of large requests, as often as the mix allows at this level: no change
        if epoch is not None and epoch < self._epoch:
            # Admitted under a limit already cut for this congestion event: no new cut. Where memory
            # is read (and the cut was one step), the limit still goes no higher than the requests
            # that survive the burst: those are known to fit (inputs that doubled fail in a burst).
            if room is not None and ran_out_at - 1 < self._aimd_limit:
                self._aimd_limit = max(self.min_limit, ran_out_at - 1)
                self._update("out of memory")
            return
        self.oom_hold.record(now_s, ran_out_at, room)
        self._cut(self.oom_backoff if room is None else 1.0, "out of memory", ran_out_at=ran_out_at)

    on_swallowed_oom = partialmethod(on_oom, placed=False)  # optional in the protocol (`GateCore.sample`)

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None:
        self.memory.add(now_s, in_flight, sample.used_bytes, sample.total_bytes)
        self.oom_hold.observe(now_s, self.memory.room())
        self._over_watermark = sample.utilisation > self.high_watermark
        if self._over_watermark and now_s - self._last_pressure_cut_s >= self.pressure_cooldown_s:
            self._last_pressure_cut_s = now_s
            self._cut(self.pressure_backoff, "memory above high watermark")
        else:
            self._update("memory cap")

    def units_changed(self) -> None:
        """The gate weighs its routes anew (`GateCore.weigh`): a slot now means another share of a
        request. The knee's latencies were timed in the old slots, and the memory model's line was
        drawn through readings counted in them; its estimates and the OOM levels carry over (a
        change of weights keeps the scale: a slot holds the bytes it held)."""
        self.knee.forget()
        self.oom_budget.forget()
        self.memory.units_changed()

    def describe(self) -> dict[str, Any]:
        est = self.memory.estimate()
        return {
            "controller": "aimd",
            "bound": self._active_bound(),
            "aimd_limit": self._aimd_limit,
            "slow_start": self._in_slow_start,
            "epoch": self._epoch,
            "over_watermark": self._over_watermark,
            "oom_ceiling": self.oom_hold.ceiling,
            "oom_budget": {"budget": self.oom_budget.budget, "levels": self.oom_budget.levels()},
            "memory_model": None
            if est is None
            else {
                "baseline_bytes": round(est.baseline_bytes),
                "per_request_bytes": round(est.per_request_bytes),
                "per_request_spread_bytes": round(est.spread_bytes),
                "cap": self.memory.cap(),
                "target_utilisation": self.memory.target_utilisation,
                "samples": self.memory.samples,
            },
        }

    # -- internals ------------------------------------------------------------------------------

    def _memory_cap(self) -> int:
        cap = self.memory.cap()
        return self.max_limit if cap is None else max(self.min_limit, cap)

    def _active_bound(self) -> str:
        cap = self._memory_cap()
        if self._limit == self._aimd_limit and self._aimd_limit <= cap and self._aimd_limit < self.max_limit:
            return "controller"
        if cap < self.max_limit and self._limit == cap:
            return "memory_cap"
        return "max_limit"

    def _update(self, reason: str) -> None:
        new_limit = self._clamp(min(self._aimd_limit, self._memory_cap()))
        if new_limit != self._limit:
            self._reason = reason
            self._limit = new_limit

    def _cut(self, factor: float, reason: str, *, ran_out_at: int | None = None) -> None:
        current = self._limit
        cut_to = min(math.floor(current * factor), current - 1)
        if ran_out_at is not None:
            cut_to = min(cut_to, ran_out_at - 1)  # memory ran out with that many: go below it
        self._aimd_limit = max(self.min_limit, cut_to)
        self._in_slow_start = False
        self._window_successes = 0
        self._epoch += 1
        self._update(reason)
