"""Findings: the classic mistakes of GPU serving, recognised from what the gate already sees.

Each finding is a short message (what was seen, with numbers) and a piece of advice (what to do).
A finding appears, is logged once as it appears, counts once per appearance, and clears when the
condition goes away; events (a stalled event loop) clear after a quiet spell. Like the controllers,
this is arithmetic on observations: the caller passes the time in, so tests replay it exactly.

| code | seen from |
| --- | --- |
| `blocking_call_in_async_route` | the event loop stalled while a gated `async def` route ran |
| `event_loop_stalled` | the loop stalled with no gated async route running: something else blocks it |
| `idle_memory_growth` | memory with nothing in flight creeps up over minutes: a leak |
| `fragmentation` | PyTorch's reserved memory stays far above what its tensors hold |
| `shared_gpu` | more than one process holds memory on the device |
| `limit_at_minimum` | the limit sits at `min_limit` while requests wait |
| `limit_at_maximum` | the limit sits at `max_limit` while requests wait and more fit on the card |
| `probe_failing` | the memory probe keeps failing |
| `batcher_without_its_controller` | a batcher runs behind the gate, whose limit is not the batcher's |
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._checks import check_fraction, check_int, check_seconds
from ..memory import MemorySample

__all__ = ["CODES", "Diagnostics", "Finding"]

logger = logging.getLogger("adaptive_gate")

MIB = 1 << 20

CODES = (
    "blocking_call_in_async_route",
    "event_loop_stalled",
    "idle_memory_growth",
    "fragmentation",
    "shared_gpu",
    "limit_at_minimum",
    "limit_at_maximum",
    "probe_failing",
    "batcher_without_its_controller",
)


@dataclass
class Finding:
    code: str
    message: str
    advice: str
    first_seen_unix_s: float
    last_seen_unix_s: float
    appearances: int = 1
    active: bool = True
    _last_seen_s: float = 0.0  # monotonic, for clearing events after a quiet spell

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "active": self.active,
            "message": self.message,
            "advice": self.advice,
            "first_seen_unix_s": round(self.first_seen_unix_s, 3),
            "last_seen_unix_s": round(self.last_seen_unix_s, 3),
            "appearances": self.appearances,
        }


def _mib(nbytes: float) -> str:
    return f"{nbytes / MIB:,.0f} MiB"


def _expandable_segments_set() -> bool:
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    return "expandable_segments:true" in conf.replace(" ", "").lower()


class Diagnostics:
    """Watches the gate's observations for the mistakes above. Thresholds are keyword arguments.

    * `loop_stall_s=0.05`, `stall_strikes=3`, `long_stall_s=0.5`: a loop that wakes this much late
      has been blocked; said after this many such stalls within `event_quiet_s`, or at once for a
      long one (one stall alone may be a pause of the machine; a habit is a bug).
    * `event_quiet_s=300`: a stall finding clears after this long without another.
    * `leak_window_s=600`, `leak_min_span_s=120`, `leak_min_growth_bytes=64 MiB`,
      `leak_min_growth_fraction=0.01`: idle memory compared across the window, once it spans long
      enough, must grow by the larger of the two (bytes, or that fraction of the card) to be a leak.
    * `fragmentation_fraction=0.2`, `fragmentation_for_s=10`: reserved minus allocated above this
      fraction of the card for this long.
    * `stuck_for_s=60`: the limit at `min_limit` with requests waiting, this long; or at `max_limit` where more
      fit on the card.
    * `probe_errors=5`: this many failed probe readings in a row.
    """

    def __init__(
        self,
        *,
        loop_stall_s: float = 0.05,
        stall_strikes: int = 3,
        long_stall_s: float = 0.5,
        event_quiet_s: float = 300.0,
        leak_window_s: float = 600.0,
        leak_min_span_s: float = 120.0,
        leak_min_growth_bytes: int = 64 * MIB,
        leak_min_growth_fraction: float = 0.01,
        fragmentation_fraction: float = 0.2,
        fragmentation_for_s: float = 10.0,
        stuck_for_s: float = 60.0,
        probe_errors: int = 5,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.loop_stall_s = check_seconds("loop_stall_s", loop_stall_s, allow_zero=False)
        self.stall_strikes = check_int("stall_strikes", stall_strikes, 1)
        self.long_stall_s = check_seconds("long_stall_s", long_stall_s, allow_zero=False)
        if long_stall_s < loop_stall_s:
            raise ValueError(
                f"long_stall_s ({long_stall_s}) must be >= loop_stall_s ({loop_stall_s}): a stall counts from "
                "loop_stall_s, and one of long_stall_s counts as a habit at once"
            )
        self._stalls: dict[str, deque[float]] = {
            "blocking_call_in_async_route": deque(maxlen=stall_strikes),
            "event_loop_stalled": deque(maxlen=stall_strikes),
        }
        self.event_quiet_s = check_seconds("event_quiet_s", event_quiet_s, allow_zero=False)
        self.leak_window_s = check_seconds("leak_window_s", leak_window_s, allow_zero=False)
        self.leak_min_span_s = check_seconds("leak_min_span_s", leak_min_span_s, allow_zero=False)
        if leak_min_span_s > leak_window_s:
            raise ValueError(f"leak_min_span_s ({leak_min_span_s}) must be <= leak_window_s ({leak_window_s})")
        self.leak_min_growth_bytes = check_int("leak_min_growth_bytes", leak_min_growth_bytes, 0)
        self.leak_min_growth_fraction = check_fraction("leak_min_growth_fraction", leak_min_growth_fraction)
        self.fragmentation_fraction = check_fraction("fragmentation_fraction", fragmentation_fraction)
        self.fragmentation_for_s = check_seconds("fragmentation_for_s", fragmentation_for_s)
        self.stuck_for_s = check_seconds("stuck_for_s", stuck_for_s)
        self.probe_errors = check_int("probe_errors", probe_errors, 1)
        if not callable(wall_clock):
            raise TypeError(f"wall_clock must be a callable answering seconds since the epoch, got {wall_clock!r}")
        self._wall_clock = wall_clock
        self._findings: dict[str, Finding] = {}
        # Idle readings, one per second at most: (monotonic s, bytes).
        self._idle: deque[tuple[float, int]] = deque()
        self._fragmented_since_s: float | None = None
        self._held_since_s: dict[str, float] = {}  # since when the limit was held at a bound with demand, by code

    # -- what the gate reports ------------------------------------------------------------------

    def on_loop_stall(self, now_s: float, stall_s: float, routes: Iterable[tuple[str, bool]]) -> None:
        """The event loop woke `stall_s` late; `routes` ran meanwhile: (label, is an async def)."""
        if stall_s < self.loop_stall_s:
            return
        async_routes = sorted({label for label, is_async in routes if is_async})
        code = "blocking_call_in_async_route" if async_routes else "event_loop_stalled"
        stalls = self._stalls[code]
        stalls.append(now_s)
        habit = len(stalls) == self.stall_strikes and now_s - stalls[0] <= self.event_quiet_s
        if not habit and stall_s < self.long_stall_s:
            return
        if async_routes:
            self._raise(
                now_s,
                "blocking_call_in_async_route",
                f"the event loop stalled {stall_s * 1000:.0f} ms while {', '.join(async_routes)} ran; "
                "an async def route that calls the model directly blocks every other request and the gate itself",
                "declare the route with plain `def` (it then runs in the thread pool), or await "
                "`anyio.to_thread.run_sync(model, ...)` around the GPU call",
            )
        else:
            self._raise(
                now_s,
                "event_loop_stalled",
                f"the event loop stalled {stall_s * 1000:.0f} ms with no gated async route running",
                "something blocks the event loop: a sync call in an async def route, middleware or startup hook; "
                "run it in a thread (`anyio.to_thread.run_sync`)",
            )

    def on_batcher(self, now_s: float, names: list[str], follows: str | None = None) -> None:
        """Batchers (`names`) ran under gated requests of a gate whose limit is not their capacity
        (`follows`: the batcher whose capacity it is, where it is one's). A set-up that lasts: the
        finding stays until the process ends."""
        listed = ", ".join(names)
        if follows is None:
            seen = "the gate counts their items one by one as requests (so batches hardly form)"
        else:
            seen = f"the gate's limit is {follows}'s capacity, which counts their items as its own"
        if len(names) == 1 and follows is None:
            advice = (
                f"pass controller={listed}.gate_controller() to the gate: its limit becomes the batcher's capacity, "
                "and the batcher reads the card through the gate's sampler"
            )
        else:
            advice = (
                "a gate's limit follows one batcher: give each batched route a gate of its own "
                "(controller=f.gate_controller()), or batch one route alone"
            )
        self._raise(
            now_s,
            "batcher_without_its_controller",
            f"batched functions run behind this gate that do not set its limit ({listed}): {seen}, and each reads "
            "the card on its own: two views of one card",
            advice,
        )

    def on_sample(self, now_s: float, sample: MemorySample, *, in_flight: float, queued: int) -> None:
        if in_flight == 0 and queued == 0:
            self._watch_idle_memory(now_s, sample)
        self._watch_fragmentation(now_s, sample)
        self._watch_processes(now_s, sample)

    def on_tick(
        self,
        now_s: float,
        *,
        limit: int,
        min_limit: int,
        max_limit: int,
        queued: int,
        probe_errors_in_row: int,
        fits: int | None = None,
    ) -> None:
        """Once a second: the states that last. `fits`: how many slots fit on the card by the controller's
        model of its memory, where it has one."""
        self._watch_limit(now_s, limit, min_limit, max_limit, queued)
        self._watch_cap(now_s, limit, min_limit, max_limit, queued, fits)
        if probe_errors_in_row >= self.probe_errors:
            self._raise(
                now_s,
                "probe_failing",
                f"the memory probe failed {probe_errors_in_row} times in a row; the gate runs on OOM and latency "
                "signals alone meanwhile",
                "see probe.last_error in the status: a missing driver, nvidia-ml-py not installed, or a wedged GPU",
            )
        else:
            self._clear("probe_failing")
        for code in ("blocking_call_in_async_route", "event_loop_stalled"):
            finding = self._findings.get(code)
            if finding is not None and finding.active and now_s - finding._last_seen_s > self.event_quiet_s:
                self._clear(code)

    # -- what it says ---------------------------------------------------------------------------

    def findings(self) -> list[dict[str, Any]]:
        """Active findings first, then the ones that cleared, in the order they first appeared."""
        ordered = sorted(self._findings.values(), key=lambda f: (not f.active, f.first_seen_unix_s))
        return [finding.as_dict() for finding in ordered]

    def appearances(self) -> dict[str, int]:
        return {code: self._findings[code].appearances if code in self._findings else 0 for code in CODES}

    def active(self) -> set[str]:
        return {code for code, finding in self._findings.items() if finding.active}

    # -- the watches ----------------------------------------------------------------------------

    def _watch_idle_memory(self, now_s: float, sample: MemorySample) -> None:
        # This process's tensors where PyTorch tells them apart; else the card, neighbours included.
        nbytes = sample.allocated_bytes if sample.allocated_bytes is not None else sample.used_bytes
        if self._idle and now_s - self._idle[-1][0] < 1.0:
            return
        self._idle.append((now_s, nbytes))
        while self._idle and now_s - self._idle[0][0] > self.leak_window_s:
            self._idle.popleft()
        span_s = self._idle[-1][0] - self._idle[0][0]
        if span_s < self.leak_min_span_s:
            return
        # The lowest reading of the first and of the last fifth: robust to a stray busy reading.
        fifth = max(1, len(self._idle) // 5)
        readings = [b for _, b in self._idle]
        early, late = min(readings[:fifth]), min(readings[-fifth:])
        growth = late - early
        threshold = max(self.leak_min_growth_bytes, self.leak_min_growth_fraction * sample.total_bytes)
        if growth >= threshold:
            self._raise(
                now_s,
                "idle_memory_growth",
                f"memory with nothing in flight rose by {_mib(growth)} over {span_s / 60:.1f} min "
                f"({_mib(early)} -> {_mib(late)})",
                "something keeps tensors alive between requests: results or exceptions stored in a list or cache, "
                "tensors kept for logging, a growing KV cache; `torch.cuda.memory_snapshot()` shows who holds them",
            )
        elif growth < threshold / 2:
            self._clear("idle_memory_growth")

    def _watch_fragmentation(self, now_s: float, sample: MemorySample) -> None:
        if sample.reserved_bytes is None or sample.allocated_bytes is None:
            return
        gap = sample.reserved_bytes - sample.allocated_bytes
        if gap < self.fragmentation_fraction * sample.total_bytes:
            self._fragmented_since_s = None
            self._clear("fragmentation")
            return
        if self._fragmented_since_s is None:
            self._fragmented_since_s = now_s
        if now_s - self._fragmented_since_s < self.fragmentation_for_s:
            return
        if _expandable_segments_set():
            advice = (
                "expandable_segments is already on: mixed input sizes still leave cached blocks; bucket or pad "
                "inputs to a few shapes, or call torch.cuda.empty_cache() after rare large requests"
            )
        else:
            advice = (
                "start the process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so the allocator grows "
                "segments instead of caching blocks of every size it has seen"
            )
        self._raise(
            now_s,
            "fragmentation",
            f"PyTorch holds {_mib(sample.reserved_bytes)} reserved but only {_mib(sample.allocated_bytes)} in "
            f"tensors ({_mib(gap)} cached or fragmented) for {now_s - self._fragmented_since_s:.0f} s",
            advice,
        )

    def _watch_processes(self, now_s: float, sample: MemorySample) -> None:
        if sample.process_count is None:
            return
        if sample.process_count > 1:
            self._raise(
                now_s,
                "shared_gpu",
                f"{sample.process_count} processes hold memory on this GPU: several workers that each load the "
                "model, a model loaded twice, or another service",
                "one worker per GPU is usually best: the gate queues for it, and each extra worker adds a copy of "
                "the weights, not throughput; where they must share, each gate sees the others' memory through NVML",
            )
        else:
            self._clear("shared_gpu")

    def _watch_limit(self, now_s: float, limit: int, min_limit: int, max_limit: int, queued: int) -> None:
        def say(for_s: float) -> tuple[str, str]:
            return (
                f"the limit has stayed at min_limit={min_limit} for {for_s:.0f} s while requests wait",
                "see controller.memory_model and limit_changes in the status: a request needs most of the card, "
                "a neighbour holds it, or OOMs keep cutting; a bigger card, smaller inputs, or more replicas",
            )

        self._watch_held(now_s, "limit_at_minimum", limit <= min_limit < max_limit, queued, say)

    def _watch_cap(
        self, now_s: float, limit: int, min_limit: int, max_limit: int, queued: int, fits: int | None
    ) -> None:
        """The limit held at `max_limit` while requests wait and more fit on the card: a unit of `cost` far below
        a typical request (tokens, not tokens / 512) fills the default 64 slots with a fraction of the card, and
        nothing else says so."""

        def say(for_s: float) -> tuple[str, str]:
            return (
                f"the limit has stayed at max_limit={max_limit} for {for_s:.0f} s while requests wait, and the card "
                f"has room for {fits} slots",
                "raise max_limit; or, where requests come with a `cost`, count it in larger units, so that a typical "
                "request weighs about 1 (tokens / 512, not tokens): max_limit counts the same slots",
            )

        capped = min_limit < max_limit <= limit and fits is not None and fits > max_limit
        self._watch_held(now_s, "limit_at_maximum", capped, queued, say)

    def _watch_held(
        self, now_s: float, code: str, held: bool, queued: int, say: Callable[[float], tuple[str, str]]
    ) -> None:
        """A state of the limit (`held`) said once it has lasted `stuck_for_s` while requests wait (`say`: its
        message and advice, from how long), and cleared as soon as it ends; a lull, nothing queued, neither
        says nor clears it (at a bound by choice, not held there)."""
        if not held:
            self._held_since_s.pop(code, None)
            self._clear(code)
            return
        if queued == 0:
            return
        since_s = self._held_since_s.setdefault(code, now_s)
        if now_s - since_s >= self.stuck_for_s:
            self._raise(now_s, code, *say(now_s - since_s))

    # -- bookkeeping ----------------------------------------------------------------------------

    def _raise(self, now_s: float, code: str, message: str, advice: str) -> None:
        wall_s = self._wall_clock()
        finding = self._findings.get(code)
        appeared = finding is None or not finding.active
        if finding is None:
            finding = self._findings[code] = Finding(code, message, advice, wall_s, wall_s, _last_seen_s=now_s)
        elif appeared:
            finding.active = True
            finding.appearances += 1
        finding.message, finding.advice = message, advice
        finding.last_seen_unix_s, finding._last_seen_s = wall_s, now_s
        if not appeared:
            return  # still the same finding: said once already
        logger.warning(
            "adaptive_gate finding %s: %s. Advice: %s",
            code,
            message,
            advice,
            extra={"adaptive_gate": {"event": "finding", "code": code, "message": message, "advice": advice}},
        )

    def _clear(self, code: str) -> None:
        finding = self._findings.get(code)
        if finding is not None:
            finding.active = False
