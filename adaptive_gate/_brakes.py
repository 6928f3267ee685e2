"""Two things that stop AIMD from growing, each a small state machine with the time passed in.

* `OomHold`: after an out-of-memory error with N requests in flight, N is not tried again while
  the card is as tight as it was then: where memory is read, until the room it has (in requests)
  grows past what it had at the OOM (a neighbour left, inputs shrank); where it is not read, for a
  while, doubling at each repeat. This is what stops AIMD from paying an OOM on every probe of a
  known-bad limit, without barring that limit after the card has changed.
* `KneeBrake`: latency as a brake, never the overload signal. When one more concurrent request no
  longer buys `knee_gain` of the ideal throughput gain, window after window, growth stops there for
  a while, and the step that got there is taken back. The two levels compared must have been seen
  in the same stretch of traffic: a latency measured many windows ago was measured under another
  load from outside the gate (the event loop's other work, other processes on the machine, a
  neighbour's kernels), and set against today's it blames concurrency for what the machine did.
"""

from __future__ import annotations

import math
from enum import Enum

__all__ = ["KNEE_STRIKES", "KneeBrake", "KneeVerdict", "OomHold"]

# Windows in a row that must show the throughput knee before the brake acts: one slow window (a
# warm-up, a pause of the event loop) is not a knee.
KNEE_STRIKES = 3
# How recently (in windows of `limit` successes) the level below must have been seen to be set
# against the limit's. Growth steps one level at a time and judges each step over the next windows,
# so the level it came from is at most a few windows old; at a steady limit under a queue, requests
# run at the limit and the level below goes stale. On the 2-core demo the latency of one request
# alone, measured idle at start-up, held the limit at 1-2 for good, set against latencies at 2
# measured under a load that slowed every request (1 at 64 ms idle, 2 at 100-200 ms loaded).
KNEE_FRESH_WINDOWS = 2 * KNEE_STRIKES
# Successes the latency at the limit must average before it may show a knee there.
KNEE_MIN_SAMPLES = 8
# How much roomier (in requests) the card must be than at an OOM before its level is tried again.
ROOM_MARGIN = 0.5
OOM_STATE_S = 1.0  # how long after an OOM the readings still describe the state it happened in
MAX_STATES = 16  # the recent OOMs' states kept (each for at most `max_hold_s`)


class OomHold:
    """The fewest in flight that ran out of memory lately, and until when to stay below it."""

    def __init__(self, *, hold_s: float, max_hold_s: float) -> None:
        if not 0 <= hold_s <= max_hold_s:
            raise ValueError(f"need 0 <= oom_hold_s <= max_oom_hold_s, got {hold_s} and {max_hold_s}")
        self.hold_s = float(hold_s)
        self.max_hold_s = float(max_hold_s)
        self.ceiling: int | None = None
        self._until_s = -math.inf
        self._hold_now_s = self.hold_s
        self._last_oom_s = -math.inf
        # Where memory is read: each recent OOM's [level, room then, when]. Each bars its own level
        # and up while the card is as tight as it was then, whatever the other OOMs' states.
        self._states: list[list[float]] = []
        self._room_known = False  # whether the latest OOM came with a room

    def record(self, now_s: float, ran_out_at: int, room: float | None = None) -> None:
        """Memory ran out with `ran_out_at` requests in flight, when the card had `room` for so many
        requests as far as the readings told (None: memory is not read)."""
        self._room_known = room is not None
        self._states = [state for state in self._states if now_s < state[2] + self.max_hold_s]
        if room is not None:
            self._states = self._states[-(MAX_STATES - 1) :] + [[ran_out_at, room, now_s]]
        if now_s - self._last_oom_s > self.max_hold_s:
            self.ceiling, self._hold_now_s = None, self.hold_s  # a long quiet spell: forget it
        if self.ceiling is not None and ran_out_at >= self.ceiling:
            self._hold_now_s = min(self.max_hold_s, self._hold_now_s * 2)  # a known-bad level, again
        else:
            self.ceiling, self._hold_now_s = ran_out_at, self.hold_s
        self._last_oom_s = now_s
        self._until_s = now_s + self._hold_now_s

    def observe(self, now_s: float, room: float | None) -> None:
        """A reading after the OOM: for `OOM_STATE_S` the state it happened in is still being read
        (the reading that shows a neighbour's arrival may come after the OOM it caused), so the
        tightest room seen then is the one recorded."""
        if room is None:
            return
        for state in self._states:
            if now_s - state[2] <= OOM_STATE_S:
                state[1] = min(state[1], room)

    def bars(self, level: int, now_s: float, room: float | None = None) -> bool:
        """Whether `level` is barred now, with `room` for so many requests as the readings tell."""
        if self.ceiling is None or level < self.ceiling:
            return False
        if self._room_known and room is not None:
            # Conditional: barred while the card is no roomier than when that level (or one below
            # it) ran out (within half a request), for at most `max_hold_s` after that OOM.
            return any(
                level >= ran_out_at and room < room_then + ROOM_MARGIN and now_s < at_s + self.max_hold_s
                for ran_out_at, room_then, at_s in self._states
            )
        return now_s < self._until_s


class KneeVerdict(Enum):
    GROW = "grow"
    WAIT = "wait"  # not enough recent latency, or one window's evidence only: judge again later
    BRAKE = "brake"  # past the knee window after window: stop growing here (and step back if grown here)


class KneeBrake:
    """Latency at each (mean) concurrency, and the limit above which growth bought nothing lately."""

    def __init__(self, *, knee_gain: float, memory_s: float) -> None:
        if not 0.0 <= knee_gain <= 1.0:
            raise ValueError(f"knee_gain must be in [0, 1], got {knee_gain}")
        if memory_s <= 0:
            raise ValueError(f"knee_memory_s must be > 0, got {memory_s}")
        self.knee_gain = float(knee_gain)
        self.memory_s = float(memory_s)
        # concurrency -> (EWMA, when last seen, `_records` when last seen, successes it averages)
        self._latency_s_by_concurrency: dict[int, tuple[float, float, int, int]] = {}
        self._records = 0  # successes recorded so far: how fresh a level is, in windows
        self._ceiling = math.inf
        self._until_s = -math.inf
        self._strikes = 0
        self._unmeasured_windows = 0  # windows in a row that ended with no latency at the limit

    def record(self, concurrency: int, latency_s: float, now_s: float) -> None:
        self._records += 1
        previous = self._latency_s_by_concurrency.get(concurrency)
        if previous is None or now_s - previous[1] > self.memory_s:
            self._latency_s_by_concurrency[concurrency] = (latency_s, now_s, self._records, 1)
        else:
            ewma_s = previous[0] + 0.2 * (latency_s - previous[0])
            self._latency_s_by_concurrency[concurrency] = (ewma_s, now_s, self._records, previous[3] + 1)

    def judge(self, limit: int, now_s: float) -> KneeVerdict:
        """At the end of a growth window at `limit`: grow, wait, or brake here."""
        past_knee = self._past_knee(limit, now_s)
        if past_knee is None:
            # Nothing ran at `limit` at once yet. Where requests weigh more than one slot, their
            # sums may never land on it (three slots each under a limit of 2: one runs, alone, at
            # 3): after a few windows without a measure there, the knee has nothing to say about it.
            self._unmeasured_windows += 1
            if self._unmeasured_windows > KNEE_FRESH_WINDOWS:
                self._unmeasured_windows = 0
                return KneeVerdict.GROW
            return KneeVerdict.WAIT
        self._unmeasured_windows = 0
        if past_knee and not self._enough(limit):
            # It looks like the knee, on a few requests: one slow answer in slow start (a window of
            # one success) would bar the level for `memory_s`. Stay and time more of them here.
            return KneeVerdict.WAIT
        self._strikes = self._strikes + 1 if past_knee else 0
        if self._strikes >= KNEE_STRIKES:
            self._strikes = 0
            self._ceiling, self._until_s = limit, now_s + self.memory_s
            return KneeVerdict.BRAKE
        return KneeVerdict.WAIT if past_knee else KneeVerdict.GROW

    def bars(self, level: int, now_s: float) -> bool:
        return level >= self._ceiling and now_s < self._until_s

    def forget(self) -> None:
        """What one slot means changed (routes got their weights): latency measured at so many
        slots before is no evidence about so many now, and neither is a knee found with it."""
        self._latency_s_by_concurrency.clear()
        self._ceiling, self._until_s, self._strikes = math.inf, -math.inf, 0

    def _enough(self, concurrency: int) -> bool:
        """Whether the latency at `concurrency` averages enough successes to judge a knee by."""
        seen = self._latency_s_by_concurrency.get(concurrency)
        return seen is not None and seen[3] >= KNEE_MIN_SAMPLES

    def _recent_latency_s(self, concurrency: int, now_s: float, *, within_records: float = math.inf) -> float | None:
        """The latency at `concurrency`, if seen within `memory_s` and the last `within_records` successes."""
        seen = self._latency_s_by_concurrency.get(concurrency)
        if seen is None or now_s - seen[1] > self.memory_s or self._records - seen[2] > within_records:
            return None
        return seen[0]

    def _past_knee(self, limit: int, now_s: float) -> bool | None:
        """Whether running `limit` at once bought less than `knee_gain` of the ideal gain over fewer.

        None when it cannot be told: this many did not run at once lately. False (grow) when no level
        below ran in the last `KNEE_FRESH_WINDOWS` windows either, as for the first step: the step up
        is then judged against this level, measured alongside it.
        """
        if self.knee_gain <= 0 or limit < 2:
            return False
        at_limit_s = self._recent_latency_s(limit, now_s)
        if at_limit_s is None:
            return None
        fresh = KNEE_FRESH_WINDOWS * limit
        below = next(
            (c for c in range(limit - 1, 0, -1) if self._recent_latency_s(c, now_s, within_records=fresh) is not None),
            None,
        )
        if below is None or at_limit_s <= 0:
            return False
        below_latency_s = self._recent_latency_s(below, now_s) or 0.0
        if below_latency_s <= 0:
            return False
        gain = (limit / at_limit_s) / (below / below_latency_s)
        ideal = limit / below
        return gain < 1.0 + self.knee_gain * (ideal - 1.0)
