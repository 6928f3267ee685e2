"""Controllers: how many gated requests may run at once, learned from what the gate observes.

A controller is arithmetic on events. It never reads a clock, sleeps or does I/O: the gate feeds it
what happened (a request finished after so many seconds, an out-of-memory error, a memory sample
taken with so many requests in flight) together with the time, and reads `limit` back. This is what
lets the simulator in the tests replay hours of traffic in a fraction of a second, exactly.

`AIMD`, the default, combines three bounds and takes the smallest:

* an AIMD limit: +1 per window of `limit` successful requests while there is real demand, a deep
  multiplicative cut on an out-of-memory error, a gentle one when memory crosses a high watermark;
* a memory cap, learned online (`MemoryModel`): the idle baseline and the bytes each request adds,
  and so how many fit under `target_utilisation` of the card (the "measure one request's
  increment" recipe, done continuously);
* `max_limit`.

Latency is used only as a brake on growth (stop where more concurrency no longer buys throughput),
never as the overload signal: on a GPU, latency is often flat until the memory runs out.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ._checks import check_fraction
from .memory import MemorySample

__all__ = ["AIMD", "Controller", "Fixed", "MemoryModel"]


@runtime_checkable
class Controller(Protocol):
    """What the gate needs from a controller. `epoch` counts the cuts made so far."""

    @property
    def limit(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def reason(self) -> str: ...

    def bind(self, *, min_limit: int, max_limit: int, initial_limit: int | None) -> None: ...

    def on_success(self, *, now_s: float, latency_s: float, concurrency: float, demand: bool) -> None: ...

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: int) -> None: ...

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: int) -> None: ...

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

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: int) -> None:
        pass

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: int) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"controller": "fixed", "bound": "controller"}


@dataclass(frozen=True)
class MemoryEstimate:
    baseline_bytes: float
    per_request_bytes: float
    total_bytes: int
    spread_bytes: float = 0.0


# Windows in a row that must show the throughput knee before the brake acts: one slow window (a
# warm-up, a pause of the event loop) is not a knee.
KNEE_STRIKES = 3

# Busy samples after which a model that still has no cap (requests that hold next to nothing on the
# card) stops holding growth back.
BLIND_GROWTH_AFTER_SAMPLES = 20


class MemoryModel:
    """Learns the idle baseline and the bytes each request adds, from (in-flight, used) samples.

    The manual recipe is "measure used memory with nothing running, then with one request, and
    take the difference". Done continuously, two ways:

    * when in-flight varied over the last `window` samples and they lie on one line, a least-squares
      fit gives both at once (its intercept is the baseline, its slope one request's bytes), from
      recent data only, so it follows a neighbour process and inputs that grow;
    * otherwise samples with nothing in flight give the baseline, and every other sample gives
      `(used - baseline) / in_flight`. From one busy level alone, a baseline that moved and requests
      that grew look the same, and so do a neighbour that left and requests that shrank. Of the two
      readings the model believes the one that fits fewer requests, until in-flight varies or the
      card idles. A rise beyond the requests' usual spread is believed ten times faster than a fall
      (fall half-life `halflife_s`): late to see growth costs OOMs, late to see relief only a little
      throughput.

    Requests of different sizes (a mixed workload) are described by a mean and an upward spread
    (how far above the mean requests go); the cap keeps `baseline + n * mean + spread_z * sqrt(n) *
    spread` under target, the sum of n such requests: cautious with the large ones, without planning
    for the worst of all at once.
    """

    def __init__(
        self,
        *,
        target_utilisation: float = 0.97,
        halflife_s: float = 5.0,
        window: int = 32,
        min_request_fraction: float = 0.001,
        spread_z: float = 1.0,
    ) -> None:
        self.target_utilisation = target_utilisation
        self.spread_z = spread_z
        if halflife_s <= 0:
            raise ValueError(f"halflife_s must be > 0, got {halflife_s}")
        if window < 4:
            raise ValueError(f"window must be >= 4 samples, got {window}")
        self._halflife_s = halflife_s
        self._min_request_fraction = min_request_fraction
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)
        self._last_s: float | None = None
        self._baseline: float | None = None
        self._per_request: float | None = None
        self._spread_sq = 0.0  # variance of one request's bytes
        self._total_bytes = 0
        self.samples = 0
        self.busy_samples = 0

    @property
    def learning(self) -> bool:
        """Samples flow but the cap is not known yet: growing now would be blind."""
        return self.samples > 0 and self.estimate() is None and self.busy_samples < BLIND_GROWTH_AFTER_SAMPLES

    def add(self, now_s: float, in_flight: int, used_bytes: int, total_bytes: int) -> None:
        elapsed_s = 0.0 if self._last_s is None else max(0.0, now_s - self._last_s)
        self._last_s = now_s
        self._total_bytes = total_bytes
        self.samples += 1
        used = float(used_bytes)
        self.busy_samples += in_flight > 0
        self._recent.append((in_flight, used))
        if self._fit_recent():
            return
        if in_flight <= 0:
            self._baseline = used if self._baseline is None else self._baseline + 0.5 * (used - self._baseline)
            return
        if self._baseline is None:
            return  # busy since the start and no spread yet: nothing to tell the baseline by
        self._baseline = min(self._baseline, used)  # whatever runs, the baseline is no more than this
        share = (used - self._baseline) / in_flight
        if self._per_request is None:
            if share >= self._min_request_fraction * total_bytes:
                self._per_request = share
            return
        # Two readings explain this sample: the requests changed (`share`), or the baseline did
        # (`moved_baseline`). Believe the one that allows fewer requests.
        moved_baseline = used - self._per_request * in_flight
        room_bytes = self.target_utilisation * total_bytes
        # Where no baseline explains it (it would be below zero), the requests are smaller than
        # believed, or some have not allocated yet: relief either way, taken slowly by `_add_share`.
        impossible_baseline = moved_baseline < 0
        if share > 0 and (
            impossible_baseline
            or (room_bytes - self._baseline) / share <= (room_bytes - moved_baseline) / self._per_request
        ):
            self._add_share(share, in_flight, elapsed_s)
        else:
            self._baseline = min(used, self._smooth(self._baseline, moved_baseline, elapsed_s, fast=False))

    def _add_share(self, share: float, in_flight: int, elapsed_s: float) -> None:
        """One sample of the mean bytes of `in_flight` requests: update their mean and spread."""
        assert self._per_request is not None
        deviation = share - self._per_request
        # A mean of n requests strays by about spread / sqrt(n): more than twice that is a shift.
        shifted_up = deviation > 2 * math.sqrt(self._spread_sq / in_flight)
        self._per_request = max(
            self._min_request_fraction * self._total_bytes,
            self._smooth(self._per_request, share, elapsed_s, fast=shifted_up),
        )
        if shifted_up or deviation <= 0:
            # A change of level is no spread; nor is a reading below the mean, which is as often a
            # request admitted but not yet allocated as a small one. Only the large ones count.
            return
        spread_seen = in_flight * deviation * deviation
        self._spread_sq = self._smooth(self._spread_sq, spread_seen, elapsed_s, fast=spread_seen > self._spread_sq)

    def _smooth(self, current: float, seen: float, elapsed_s: float, *, fast: bool) -> float:
        """Move towards `seen`: fast for danger, slowly for relief."""
        halflife_s = self._halflife_s / 10 if fast else self._halflife_s
        weight = 1.0 - 0.5 ** (elapsed_s / halflife_s) if elapsed_s > 0 else 0.5
        return current + weight * (seen - current)

    def _fit_recent(self) -> bool:
        n = len(self._recent)
        if n < 8:
            return False
        mean_x = sum(x for x, _ in self._recent) / n
        mean_y = sum(y for _, y in self._recent) / n
        var_x = sum((x - mean_x) ** 2 for x, _ in self._recent) / n
        most_common_share = max(Counter(x for x, _ in self._recent).values()) / n
        if var_x < 0.25 or most_common_share > 0.75:
            return False  # in-flight barely varied: a few stray samples must not tilt the line
        slope = sum((x - mean_x) * (y - mean_y) for x, y in self._recent) / n / var_x
        if slope < self._min_request_fraction * self._total_bytes:
            return False
        intercept = mean_y - slope * mean_x
        residual_sq = sum((y - intercept - slope * x) ** 2 for x, y in self._recent) / n
        if residual_sq > (0.25 * slope) ** 2:
            return False  # not one line: the window straddles a change (sizes, a neighbour); wait it out
        lowest_used = min(y for _, y in self._recent)
        self._baseline = min(lowest_used, max(0.0, intercept))
        self._per_request = slope
        self._spread_sq = residual_sq / max(1.0, mean_x)  # y strays by sqrt(n) times one request's spread
        return True

    def estimate(self) -> MemoryEstimate | None:
        if self._per_request is None or self._baseline is None:
            return None
        return MemoryEstimate(self._baseline, self._per_request, self._total_bytes, math.sqrt(self._spread_sq))

    def cap(self) -> int | None:
        """How many requests fit under `target_utilisation` of the card, or None if not known yet."""
        est = self.estimate()
        if est is None:
            return None
        room_bytes = self.target_utilisation * est.total_bytes - est.baseline_bytes
        n = max(0, math.floor(room_bytes / est.per_request_bytes))
        while n > 0 and n * est.per_request_bytes + self.spread_z * math.sqrt(n) * est.spread_bytes > room_bytes:
            n -= 1
        # What was seen beats what is estimated: a level that ran in every recent sample under target
        # fits, even where a noisy estimate puts the line a few percent too high.
        return max(n, self._proven_level())

    def _proven_level(self) -> int:
        if 2 * len(self._recent) < (self._recent.maxlen or 0):
            return 0  # too few samples to call anything proven
        limit_bytes = self.target_utilisation * self._total_bytes
        peak_by_level: dict[int, float] = {}
        for in_flight, used in self._recent:
            peak_by_level[in_flight] = max(used, peak_by_level.get(in_flight, 0.0))
        # Every level up to the proven one must be under target too: memory grows with the level.
        proven = 0
        for level in sorted(peak_by_level):
            if peak_by_level[level] > limit_bytes:
                break
            proven = level
        return proven


class AIMD(_Bounds):
    """Additive increase, multiplicative decrease, under a learned memory cap.

    Knobs (all keyword arguments):

    * `increase_step=1`: added to the limit after a window of `limit` successes with demand waiting.
    * `slow_start=True`: until the first cut, add `increase_step` per success instead (the limit
      doubles per window), so a big card is found in a few windows.
    * `oom_backoff=0.5`: factor applied on an out-of-memory error, at most once per congestion
      event (errors from requests admitted before the last cut are counted but do not cut again).
    * `pressure_backoff=0.9`, `high_watermark=0.98`, `pressure_cooldown_s=1.0`: a gentle cut when a
      memory sample shows more than `high_watermark` of the card used, at most once per cooldown;
      no growth while above it.
    * `target_utilisation=0.97`: the memory cap keeps the expected use under this fraction.
    * `memory_halflife_s=5.0`: how fast the memory model forgets (follows neighbours and inputs).
    * `knee_gain=0.5`: growth needs at least this fraction of the ideal throughput gain of one more
      concurrent request, judged from latency at each (mean) concurrency; where a growth step fell
      short it is taken back and not retried for `knee_memory_s=30.0`, after which old latency is
      forgotten too, so the brake cannot stick. 0 turns the latency brake off.
    * `oom_hold_s=30.0`: after an OOM with N requests in flight, the limit goes below N and does
      not climb back to N for this long (doubled at each further OOM at N or more, up to
      `max_oom_hold_s=600.0`). Where memory cannot be measured, this is what stops AIMD from paying
      an OOM on every probe of a known-bad limit.
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
        target_utilisation: float = 0.97,
        memory_halflife_s: float = 5.0,
        knee_gain: float = 0.5,
        knee_memory_s: float = 30.0,
        oom_hold_s: float = 30.0,
        max_oom_hold_s: float = 600.0,
    ) -> None:
        if isinstance(increase_step, bool) or not isinstance(increase_step, int) or increase_step < 1:
            raise ValueError(f"increase_step must be an int >= 1, got {increase_step!r}")
        self.increase_step = increase_step
        self.slow_start = bool(slow_start)
        self.oom_backoff = check_fraction("oom_backoff", oom_backoff, high=0.99)
        self.pressure_backoff = check_fraction("pressure_backoff", pressure_backoff, high=0.99)
        self.high_watermark = check_fraction("high_watermark", high_watermark)
        self.target_utilisation = check_fraction("target_utilisation", target_utilisation)
        if pressure_cooldown_s < 0:
            raise ValueError(f"pressure_cooldown_s must be >= 0, got {pressure_cooldown_s}")
        self.pressure_cooldown_s = float(pressure_cooldown_s)
        if not 0.0 <= knee_gain <= 1.0:
            raise ValueError(f"knee_gain must be in [0, 1], got {knee_gain}")
        self.knee_gain = float(knee_gain)
        if knee_memory_s <= 0:
            raise ValueError(f"knee_memory_s must be > 0, got {knee_memory_s}")
        self.knee_memory_s = float(knee_memory_s)
        if not 0 <= oom_hold_s <= max_oom_hold_s:
            raise ValueError(f"need 0 <= oom_hold_s <= max_oom_hold_s, got {oom_hold_s} and {max_oom_hold_s}")
        self.oom_hold_s = float(oom_hold_s)
        self.max_oom_hold_s = float(max_oom_hold_s)
        self.memory = MemoryModel(target_utilisation=self.target_utilisation, halflife_s=memory_halflife_s)

        self._aimd_limit = 1
        self._limit = 1
        self._epoch = 0
        self._reason = "start"
        self._window_successes = 0
        self._in_slow_start = self.slow_start
        self._over_watermark = False
        self._last_pressure_cut_s = -math.inf
        # concurrency -> (latency EWMA, when last seen)
        self._latency_s_by_concurrency: dict[int, tuple[float, float]] = {}
        self.ooms_seen = 0
        # The fewest in flight that ran out of memory lately, until when to stay below, and the hold.
        self._oom_ceiling: int | None = None
        self._oom_ceiling_until_s = -math.inf
        self._oom_hold_now_s = self.oom_hold_s
        self._last_oom_s = -math.inf
        # A limit that bought no throughput lately, until when to stay below it; the last growth.
        self._knee_ceiling = math.inf
        self._knee_until_s = -math.inf
        self._grown_to: int | None = None
        self._knee_strikes = 0

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
        self._record_latency(max(1, round(concurrency)), latency_s, now_s)
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
        past_knee = self._past_knee(self._aimd_limit, now_s)
        if past_knee is None:
            return  # not enough recent latency to judge one more: wait for it
        self._knee_strikes = self._knee_strikes + 1 if past_knee else 0
        if self._knee_strikes >= KNEE_STRIKES:
            # More at once bought no throughput, only latency, window after window: hold off growing
            # there a while, and if growth got us here, take that step back (a brake, never a cut).
            self._knee_strikes = 0
            self._in_slow_start = False
            self._knee_ceiling, self._knee_until_s = self._aimd_limit, now_s + self.knee_memory_s
            if self._grown_to == self._aimd_limit:
                self._aimd_limit = max(self.min_limit, self._aimd_limit - 1)
                self._update("throughput knee")
            self._grown_to = None
            return
        if past_knee:
            return  # one window's evidence: wait for the next before acting on it
        grown = min(self.max_limit, self._aimd_limit + self.increase_step)
        if self._oom_ceiling is not None and grown >= self._oom_ceiling and now_s < self._oom_ceiling_until_s:
            return  # this many ran out of memory lately: stay under it for now
        if grown >= self._knee_ceiling and now_s < self._knee_until_s:
            return  # this many bought nothing lately
        self._aimd_limit = self._grown_to = grown
        self._update("slow start" if self._in_slow_start else "additive increase")

    def on_oom(self, *, now_s: float, epoch: int | None, in_flight: int) -> None:
        """An out-of-memory error while `in_flight` requests (the failed one included) ran."""
        self.ooms_seen += 1
        if epoch is not None and epoch < self._epoch:
            return  # admitted under a limit that was already cut for this congestion event
        ran_out_at = max(self.min_limit + 1, in_flight)
        if now_s - self._last_oom_s > self.max_oom_hold_s:
            self._oom_ceiling, self._oom_hold_now_s = None, self.oom_hold_s  # long quiet: forget it
        if self._oom_ceiling is not None and ran_out_at >= self._oom_ceiling:
            self._oom_hold_now_s = min(self.max_oom_hold_s, self._oom_hold_now_s * 2)  # a known-bad level, again
        else:
            self._oom_ceiling, self._oom_hold_now_s = ran_out_at, self.oom_hold_s
        self._last_oom_s = now_s
        self._oom_ceiling_until_s = now_s + self._oom_hold_now_s
        self._cut(self.oom_backoff, "out of memory", ran_out_at=ran_out_at)

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: int) -> None:
        self.memory.add(now_s, in_flight, sample.used_bytes, sample.total_bytes)
        self._over_watermark = sample.utilisation > self.high_watermark
        if self._over_watermark and now_s - self._last_pressure_cut_s >= self.pressure_cooldown_s:
            self._last_pressure_cut_s = now_s
            self._cut(self.pressure_backoff, "memory above high watermark")
        else:
            self._update("memory cap")

    def describe(self) -> dict[str, Any]:
        est = self.memory.estimate()
        cap = self.memory.cap()
        return {
            "controller": "aimd",
            "bound": self._active_bound(),
            "aimd_limit": self._aimd_limit,
            "slow_start": self._in_slow_start,
            "epoch": self._epoch,
            "over_watermark": self._over_watermark,
            "oom_ceiling": self._oom_ceiling,
            "memory_model": None
            if est is None
            else {
                "baseline_bytes": round(est.baseline_bytes),
                "per_request_bytes": round(est.per_request_bytes),
                "per_request_spread_bytes": round(est.spread_bytes),
                "cap": cap,
                "target_utilisation": self.target_utilisation,
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

    def _record_latency(self, concurrency: int, latency_s: float, now_s: float) -> None:
        previous = self._latency_s_by_concurrency.get(concurrency)
        if previous is None or now_s - previous[1] > self.knee_memory_s:
            self._latency_s_by_concurrency[concurrency] = (latency_s, now_s)
        else:
            self._latency_s_by_concurrency[concurrency] = (previous[0] + 0.2 * (latency_s - previous[0]), now_s)

    def _recent_latency_s(self, concurrency: int, now_s: float) -> float | None:
        seen = self._latency_s_by_concurrency.get(concurrency)
        if seen is None or now_s - seen[1] > self.knee_memory_s:
            return None
        return seen[0]

    def _past_knee(self, limit: int, now_s: float) -> bool | None:
        """Whether running `limit` at once bought less than `knee_gain` of the ideal gain over fewer.

        None when it cannot be told: this many did not run at once lately.
        """
        if self.knee_gain <= 0 or limit < 2:
            return False
        at_limit_s = self._recent_latency_s(limit, now_s)
        if at_limit_s is None:
            return None
        below = next((c for c in range(limit - 1, 0, -1) if self._recent_latency_s(c, now_s) is not None), None)
        if below is None or at_limit_s <= 0:
            return False
        below_latency_s = self._recent_latency_s(below, now_s) or 0.0
        if below_latency_s <= 0:
            return False
        gain = (limit / at_limit_s) / (below / below_latency_s)
        ideal = limit / below
        return gain < 1.0 + self.knee_gain * (ideal - 1.0)
