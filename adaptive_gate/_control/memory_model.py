"""One model of the card's memory: the others' bytes, our requests' bytes, and what OOMs taught.

What the card holds is the others' bytes (weights, the CUDA context, caches, neighbour processes)
plus each of our requests' bytes. The manual recipe is "measure used memory with nothing running,
then with one request, and take the difference". `MemoryModel` does it continuously from (in
flight, used) readings. The limit is what fits: the requests in flight (committed, allocated yet or
not) and one more, beside the others' bytes, under `target_utilisation` of the card.

An OOM says the model was wrong about the card as it was then. It is kept as such (`OomStates`):
that level does not fit while the card is no roomier, and comes back the moment the readings say
the card changed, with no timer to wait out. The time is passed in: the simulator replays it exactly.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from .._checks import check_fraction
from .least_squares import READING_GRAIN_BYTES
from .oom_states import FIT_SLACK, OomStates

__all__ = ["BLIND_GROWTH_AFTER_SAMPLES", "MemoryEstimate", "MemoryModel", "OomStates"]


@dataclass(frozen=True)
class MemoryEstimate:
    baseline_bytes: float  # the others' bytes: what the card holds with none of ours in flight
    per_request_bytes: float
    total_bytes: int
    spread_bytes: float = 0.0


RELIEF_READINGS = 2  # readings in a row that must show room coming back before it is believed
# Readings that show our requests holding less are a shrink only where no reading within this many
# service times before (`SHRINK_READINGS` at most) showed them at their size: otherwise they caught
# slots between a request's admission and its allocation.
SHRINK_SERVICES = 1.5
SHRINK_READINGS = 8
SERVICE_SHARE = 0.1  # how far one request's service time moves their mean
MIN_MOVES = 8  # readings whose moves must be known before their median says how far a mix moves
NOISE_SPREADS = 2.0  # how far (in spreads of the sum of n requests) a reading may stray from the model
WINDOW_READINGS = 32  # readings a fit, or the requests' spread, look back over (3.2 s)
MAX_NAMED = 64  # OOMs' named sizes kept for `_whole_of_a_named_size` (the latest, where more came within the window)
# How far one reading moves the requests' mean: up twice as fast as down, as readings below are as
# often requests not allocated yet as small ones.
SHARE_UP, SHARE_DOWN = 0.2, 0.1
# Where requests are of one size, one holds at least this quantile of what the readings since the
# sizes last changed showed each holding: readings catch requests before their peak.
SIZE_QUANTILE = 0.9
MIN_QUANTILE_READINGS = 4
OWN_SHARE = 0.5  # the least of its requests' bytes the process's own count must show to tell it follows them
HOLLOW_SHARE = 0.25  # a reading whose requests hold less than this of the mean each teaches no size
SHARE_SHRUNK = 0.25  # how far a first step of a shrink moves the size (two readings in a row)
# The least a request (or unit of cost) is taken to hold, as a share of the card: never 0 bytes.
MIN_REQUEST_FRACTION = 0.001
# Readings since the card last changed after which the requests' spread is known well enough to
# call them of one size, and an allocation beyond it a change of sizes.
SETTLED_READINGS = 10
# A mix's pile-ups: the share of its requests that may meet one, and how far one moves the tail
# planned for (`z`, in spreads).
MIX_OOM_SHARE = 0.05
MIX_SPREAD = 0.25  # a spread of more than this share of the mean makes the requests a mix
# Unless each reading's requests hold a whole number of one size, within this share of the largest share
# read: requests of that size, some of them caught before they allocate (`_whole_size`).
WHOLE_TOLERANCE = 0.02
# Where told, the least share of the most a unit held that one of `WINDOW_READINGS` busy readings must show a
# unit holding for that size to hold (`_watch_unit_held`): readings that catch requests before they allocate
# show less than the size at their most.
HELD_SHARE = 0.6
Z_STEP = 0.25
MIN_Z, MAX_Z = 1.0, 6.0
# Busy samples after which a model that still has no cap (requests that hold next to nothing on the
# card) stops holding growth back.
BLIND_GROWTH_AFTER_SAMPLES = 20


def _off_whole(held: float, size: float) -> float:
    """How far `held` bytes lie from a whole number of requests of `size` bytes each."""
    return abs(held - round(held / size) * size)


def _all_whole(readings: list[tuple[float, float]], floor: float, size: float) -> bool:
    """Whether each of the (used, in flight) `readings` holds, beside the others' `floor`, a whole number of `size`."""
    return size > 0 and all(_off_whole(used - floor, size) <= WHOLE_TOLERANCE * size for used, _ in readings)


def _least_whole(shares: Sequence[tuple[float, float]]) -> float | None:
    """The least size, no smaller than any of these (share, in flight) readings' shares, of which each
    showed its requests holding a whole number (`WHOLE_TOLERANCE`), one at least fewer than were in
    flight; None where there is none."""
    if len(shares) < MIN_QUANTILE_READINGS or any(n != round(n) for _, n in shares):
        return None
    top, top_in_flight = max(shares)
    if top <= 0:
        return None  # nothing held at all: no size to count in
    # The top reading as `whole` requests of one size, at least half of those it had in flight: fewer,
    # and one size of many requests' bytes would pass for one of any few readings' sums.
    sums = [(share * n, n) for share, n in shares]  # (bytes held, in flight) of each reading
    for whole in range(round(top_in_flight), math.ceil(top_in_flight / 2) - 1, -1):
        size = top * top_in_flight / whole
        # Off by a share of the top reading's, not of the size tried: a larger size is no looser a fit
        if all(_off_whole(held, size) <= WHOLE_TOLERANCE * top for held, _ in sums):
            return size if any(round(held / size) < n for held, n in sums) else None
    return None


class MemoryModel:
    """The others' bytes and the bytes each request adds, learned from (in-flight, used) readings.

    * A reading with nothing of ours in flight is exactly what the others hold.
    * Where in-flight varied over the readings since the card last changed and they lie on one
      line, a least-squares fit gives both: its intercept is the others' bytes, its slope a request's.
    * Otherwise a busy reading within the requests' usual spread teaches their mean (up faster than
      down) and spread, while the others' bytes stay anchored. Where they are of one size, a request
      holds at least what nine in ten of those readings showed (`SIZE_QUANTILE`); where each of them
      holds a whole number of one size, some fewer than were in flight, that size (`_whole_size`).
    * A rise beyond that spread is the others' (a neighbour, a leak), believed at once: the room
      shrinks before the next admission, not after an OOM. A fall is believed once `RELIEF_READINGS`
      readings in a row show it, at the most cautious of them.

    A mix of sizes the gate cannot tell apart is a mean and a spread: the cap keeps
    `others + n * mean + z * sqrt(n) * spread` under target. `z` is learned from the pile-ups
    (`mix_oom`, `mix_success`) so that about `MIX_OOM_SHARE` of a mix's requests meet one. A spread
    under `MIX_SPREAD` of the mean is the readings' noise: one size, no tail planned for.
    """

    def __init__(self, *, target_utilisation: float = 1.0) -> None:
        self.target_utilisation = check_fraction("target_utilisation", target_utilisation)
        self.z = MIN_Z  # how many spreads above the mean the cap plans for, learned
        # (when, in flight, used) of the last readings: the line's, and what the shrink test looks back over
        self._recent: deque[tuple[float, float, float]] = deque(maxlen=WINDOW_READINGS)
        self._service_s: float | None = None  # a request's mean service time (`served`)
        self._baseline: float | None = None
        self._per_request: float | None = None
        self._spread_sq = 0.0  # variance of one request's bytes
        self._quantile: float | None = None  # `SIZE_QUANTILE` of `_shares`, anew at each reading
        self._late_size: float | None = None  # a size whose readings took requests not allocated for a shrink
        self._whole: float | None = None  # the size the `_shares` are whole numbers of, anew at each reading
        self._whole_since = 0  # the reading from which they have been, without a break
        self._not_whole: float | None = None  # such a size an OOM asked for another than, since the sizes changed
        # (share of one request, in flight) of the busy readings within the spread since the change
        self._shares: deque[tuple[float, float]] = deque(maxlen=WINDOW_READINGS)
        self._hollow: list[tuple[float, float]] = []  # the hollow readings in a row since the last OOM
        # Lower baselines seen in the last readings, each with the others' bytes as the process's own
        # count read them (None: it did not tell), and the reading (used, in flight); believed when
        # RELIEF_READINGS in a row agree.
        self._pending_relief: list[tuple[float, float | None, float, float]] = []
        # The last reading's rise of the others' bytes, until the next confirms it: (the others' bytes
        # before it, whether anchored then, the share of one request it would be as ours, in flight,
        # readings since the card last changed before it, whether it came as a jump)
        self._rise: tuple[float, bool, float, float, int, bool] | None = None
        self._anchored = False  # whether the others' bytes were read idle or fitted, not inferred
        self._anchor: float | None = None  # the others' bytes when last anchored
        self._idle_floor: float | None = None  # the least the card held with nothing of ours in flight
        self._since_shrink = 0  # readings since the card last changed: only these describe it
        self._since_sizes = 0  # readings since our requests' sizes (or units) last changed
        self._size_before: float | None = None  # a request's settled bytes before the sizes last shrank
        self._last_moved_baseline: float | None = None
        self._moves: deque[float] = deque(maxlen=16)  # |move| of the apparent baseline, reading to reading
        self._total_bytes = 0
        self.samples = 0
        self.busy_samples = 0
        self.ooms = OomStates()
        # A size an OOM named (`learn_size`) and when: held while requests from before it may run.
        self._size_floor: tuple[float, float] | None = None
        # The size the readings gave before an OOM named a larger one (None: the readings' own since).
        self._size_read: float | None = None
        # This process's live bytes with nothing of ours in flight (the last read), and what our
        # requests held by that count at the last reading (None where the probe does not tell).
        self._own_idle: int | None = None
        self._own_rest_rose = False  # that rest rose after requests ran: a request's tensors not freed
        self._ours: float | None = None
        self._own_agrees = False  # whether that count told our requests' bytes at the last busy reading
        self._oldest_s: float | None = None  # when the oldest request in flight arrived, at the last reading
        # Where the sizes shrank: when the oldest request read at the smaller size arrived, the size
        # from before, and the least size read since (`heavier_before`).
        self._shrunk: tuple[float, float, float] | None = None
        # Whether the others rose into a full card, and none of ours finished since: they may take
        # each byte we free.
        self.pressed = False
        self._served_since = False  # whether a request of ours finished since the last reading
        self._shrink_step_at: int | None = None  # the reading of the last step of a shrink (`_relieve`)
        self._one_size_at: int | None = None  # the last reading after which the requests were of one size
        self._one_size_from = 0  # the first reading of the stretch of one size that ended there
        self._costs_told = False  # whether a request came with a `cost` other than 1 (`costs_told`)
        # Where told by a `cost` alone: the most a busy reading showed a unit holding (`_unit_seen`), kept till
        # the readings stop showing it (`_watch_unit_held`).
        self._unit_held: float | None = None
        # The most and the least a unit held by the busy readings since that size was last checked, and how many.
        self._held_top, self._held_low, self._held_readings = 0.0, 0.0, 0
        self._routes_weighed = False  # whether the gate ever weighed its routes (`units_changed`)
        self._more_at: int | None = None  # the last reading whose own count read ours holding more than the model
        # (reading, bytes a unit) an OOM named in the last `WINDOW_READINGS` readings (`_named_lately`)
        self._named: deque[tuple[int, float]] = deque(maxlen=MAX_NAMED)

    @property
    def learning(self) -> bool:
        """Samples flow but the cap is not known yet: growing now would be blind."""
        known = self._per_request is not None and self._baseline is not None  # estimate() without building one
        return self.samples > 0 and not known and self.busy_samples < BLIND_GROWTH_AFTER_SAMPLES

    def add(
        self, now_s: float, in_flight: float, used_bytes: int, total_bytes: int, own_bytes: int | None = None
    ) -> None:
        """One reading: `used_bytes` of `total_bytes` on the card with `in_flight` requests (units) of
        ours running; `own_bytes`, where the probe knows it, what this process's allocator holds in
        live tensors (PyTorch's `allocated_bytes`)."""
        self._total_bytes = total_bytes
        self.samples += 1
        try:
            self._read_own(in_flight, own_bytes)
            rise_before = self._rise
            self._learn(now_s, in_flight, float(used_bytes))
            full = total_bytes - used_bytes < MIN_REQUEST_FRACTION * total_bytes
            # Pressed till a request of ours finished: only the bytes one frees tell whether the others
            # want more.
            waiting = self.pressed and not self._served_since
            self.pressed = full and ((self._rise is not None and self._rise is not rise_before) or waiting)
            self._served_since = False
            self._own_agrees = self._own_told(in_flight, float(used_bytes))
            self._watch_unit_held(in_flight, float(used_bytes))
            if self.is_mix():
                self._whole_run()
            if self._anchored:
                self._anchor = self._baseline
            if not self.is_mix():
                if self._one_size_at != self.samples - 1:
                    self._one_size_from = self.samples
                self._one_size_at = self.samples
        finally:
            self._quantile = self._share_quantile()
            whole = self._whole_size()
            if whole is None or self._whole is None:
                self._whole_since = self.samples
            self._whole = whole
            est = self.estimate()
            self.ooms.observe(now_s, self.room(), 0.0 if est is None else est.per_request_bytes)

    def _read_own(self, in_flight: float, own_bytes: int | None) -> None:
        """What our requests hold by this process's own count: its live bytes beyond what it held at
        the last idle reading (the last, not the least: weights a lifespan loads come later)."""
        self._ours = None
        if own_bytes is None:
            return
        if in_flight <= 0:
            rose = self._own_idle is not None and own_bytes > self._own_idle
            self._own_rest_rose = rose and self.busy_samples > 0
            self._own_idle = own_bytes
        elif self._own_idle is not None:
            self._ours = float(max(0, own_bytes - self._own_idle))

    def _own_told(self, in_flight: float, used: float) -> bool:
        """Whether the own count told our requests' bytes at this reading (the card less them is the
        others' bytes the model holds). Only then is the next reading's count believed: a framework
        that allocates outside PyTorch's allocator never gets there. Where our requests hold too little
        to tell (a mix's small ones, requests not allocated yet or failed), the last answer stands; so
        it does where it read the others fall, till the next reading confirms the fall or not."""
        mean, others = self._per_request, self._baseline
        if self._ours is None or mean is None or others is None:
            return self._own_agrees if in_flight <= 0 else False
        fall_pending = bool(self._pending_relief) and self._pending_relief[-1][1] is not None
        if self._ours < OWN_SHARE * mean * in_flight or fall_pending:
            return self._own_agrees  # too little to tell, or a fall it read that the next reading confirms or not
        return abs(used - self._ours - others) <= self._own_slack(in_flight)

    def _sizes_settled(self) -> bool:
        """Whether `SETTLED_READINGS` readings have passed since our requests' sizes (or units) last
        changed: a size from before then is one the readings held, not one they were still learning."""
        return self._since_sizes >= SETTLED_READINGS

    def _settled_whole(self) -> float | None:
        """The size the readings have held whole numbers of for `SETTLED_READINGS` in a row, or None: then
        the requests are of that size, and the readings' spread is of slots not allocated yet, not of
        sizes. (A mix whose sums fall whole by chance does so for a few readings.)"""
        return self._whole if self.samples - self._whole_since >= SETTLED_READINGS else None

    def _own_slack(self, in_flight: float) -> float:
        """How far the card less the own count may stray from the others' bytes and still agree. By
        the requests' spread, not where they are read whole: then the spread is of readings that caught
        some not allocated yet, which the own count does not."""
        assert self._per_request is not None
        spread_sq = 0.0 if self._settled_whole() is not None else self._spread_sq
        return HOLLOW_SHARE * self._per_request + NOISE_SPREADS * math.sqrt(spread_sq * in_flight)

    def _own_count_rose(self, in_flight: float, used: float) -> bool:
        """Whether the own count, believed (`_own_told`), says the others rose at this busy reading."""
        others = self._baseline
        if in_flight <= 0 or self._ours is None or not self._own_agrees or others is None:
            return False
        return used - self._ours - others > self._own_slack(in_flight)

    def _learn(self, now_s: float, in_flight: float, used: float) -> None:
        self.busy_samples += in_flight > 0
        if in_flight <= 0 and self._per_request is not None:
            if any(abs(used - b) > 0.25 * self._per_request for b in (self._baseline, self._anchor) if b is not None):
                # Idle, and the others hold another amount than believed or last anchored: the card
                # changed, and no line may span it.
                self._changed()
        self._recent.append((now_s, in_flight, used))
        self._since_shrink += 1
        self._since_sizes += 1
        shrunk = self._shrunk
        if self._none_from_before(in_flight, used):
            assert shrunk is not None and self._oldest_s is not None  # as `_old_sizes_may_run` found them
            shrunk = self._shrunk = (self._oldest_s, shrunk[1], shrunk[2])  # it arrived after the sizes shrank
        if self._old_sizes_may_run():
            # A request from before the sizes shrank holds more than the others: no line through them.
            self._changed()
        if shrunk is not None and self._per_request is not None and self._per_request < shrunk[2]:
            self._shrunk = (shrunk[0], shrunk[1], self._per_request)  # the least size read since
        if self._fit_recent():
            self._pending_relief.clear()
            self._rise, self._anchored = None, True
            self._shares.clear()
            return
        if in_flight <= 0:
            self._pending_relief.clear()
            self._rise = None
            self._baseline = used  # nothing of ours runs: this is exactly what the others hold
            self._anchored = True
            self._idle_floor = used if self._idle_floor is None else min(self._idle_floor, used)
            return
        if self._baseline is None:
            return  # busy since the start and no line yet: nothing to tell the others' bytes by
        if self._per_request is None:
            self._baseline = min(self._baseline, used)  # whatever runs, the others hold no more than this
            share = (used - self._baseline) / in_flight
            if share >= MIN_REQUEST_FRACTION * self._total_bytes:
                self._per_request = share
                self._shares.append((share, in_flight))
                self._unit_seen(share)
            return
        self._read_busy(used, in_flight)

    def _read_busy(self, used: float, in_flight: float) -> None:
        """A busy reading against the model: the others' rise, their fall, or our requests' bytes
        within their usual spread (learned only while the others' bytes are anchored)."""
        assert self._per_request is not None and self._baseline is not None
        if self._baseline > used:
            # The others hold no more than is used: by the own count, where it is believed, exactly the
            # card less ours (not our requests holding less); else what was last anchored, where that fits.
            self._rise = None
            if self._ours is not None and self._own_agrees:
                self._baseline, self._anchored = used - self._ours, False
            elif self._anchor is not None and self._anchor <= used:
                self._baseline, self._anchored = self._anchor, True
            else:
                self._baseline, self._anchored = used, False
        # Requests read whole are of that size, not their mean: the mean counts the slots not allocated
        # yet, and every reading of them all allocated would read as the others' rise. Under a cost, for
        # the same reason, a unit is at least the most one was seen holding (`_unit_held`).
        size = self._settled_whole() or max(self._per_request, self._unit_held or 0.0)
        moved_baseline = used - size * in_flight
        # How far n requests stray: twice their spread, or three times the apparent baseline's usual
        # move from reading to reading (a mix whose spread is still being learned).
        usual_move = statistics.median(self._moves) if len(self._moves) >= MIN_MOVES else 0.0
        noise_bytes = max(NOISE_SPREADS * math.sqrt(self._spread_sq * in_flight), 3 * usual_move, READING_GRAIN_BYTES)
        # The others' bytes before a rise that the next reading has yet to confirm.
        before = self._baseline if self._rise is None else self._rise[0]
        own_others = used - self._ours if self._ours is not None and self._own_agrees else None
        # The own count is exact: it strays by its own slack, however far the readings move (requests
        # caught before they allocate, a mix's).
        own_rose = False
        if own_others is not None and own_others > before + min(noise_bytes, self._own_slack(in_flight)):
            own_rose = True
            # The others rose by the own count: believed at least that far, where requests that failed
            # to allocate (holding nothing, still in flight) hide it from the count in flight.
            moved_baseline = max(moved_baseline, own_others)
        jumped = self._jumped(moved_baseline)
        rise, self._rise = self._rise, None
        if rise is not None and not own_rose and moved_baseline <= rise[0] + noise_bytes:
            # The last reading's rise is gone at the next: it was our requests (a mix's large ones).
            self._baseline, self._anchored = rise[0], rise[1]
            if self._anchored:
                # Its share is taught where sizes vary or are not known yet; where they have been one
                # size for a while, it was a blip of the others'.
                if self.is_mix() or rise[4] < SETTLED_READINGS:
                    self._add_share(rise[2], rise[3])
                self._add_share((used - self._baseline) / in_flight, in_flight)
            return
        if rise is not None and rise[5]:
            self._changed()  # a rise that lasts, and came as a jump: the card changed
        rose = own_rose or moved_baseline > self._baseline + noise_bytes
        if rose and own_others is not None and not own_rose and not self._old_sizes_may_run():
            # The own count reads the others where they were: our requests hold more than the model
            # says. (Not while a request from before a shrink may run: that one holds more.)
            self._pending_relief.clear()
            self._more_at = self.samples
            if self._anchored:
                self._add_share((used - self._baseline) / in_flight, in_flight)
        elif rose:
            self._pending_relief.clear()
            if rise is None:  # a first rise: believed at once, and taken back if the next reading says so
                share = (used - self._baseline) / in_flight
                self._rise = (self._baseline, self._anchored, share, in_flight, self._since_shrink, jumped)
            self._baseline, self._anchored = moved_baseline, False
        elif moved_baseline < self._baseline - noise_bytes:
            self._relieve(moved_baseline, used, in_flight, own_others)
        elif own_others is not None and own_others < self._baseline - HOLLOW_SHARE * self._per_request:
            # The own count reads the others fall where the readings swing too far to tell (requests
            # caught before they allocate, a mix's): a neighbour left. Beyond a quarter of a request, not
            # the count's slack, which holds a mix's spread: a fall is believed at two readings in a row.
            self._relieve(own_others, used, in_flight, own_others)
        else:
            self._pending_relief.clear()
            if self._anchored:
                self._add_share(self._held(used, own_others) / in_flight, in_flight)

    def _held(self, used: float, own_others: float | None) -> float:
        """What our requests hold at a busy reading within the model: the card less the others' bytes, by
        the own count where it is believed (`own_others`). By the others' bytes the model holds, a fall of
        theirs too small to be believed would read as our requests holding less, and one such reading
        keeps the window from reading them whole."""
        assert self._baseline is not None
        return used - (self._baseline if own_others is None else own_others)

    def _old_sizes_may_run(self) -> bool:
        """Whether a request that arrived before the sizes shrank may still run (`heavier_before`)."""
        shrunk = self._shrunk
        return shrunk is not None and self._oldest_s is not None and self._oldest_s < shrunk[0]

    def _none_from_before(self, in_flight: float, used: float) -> bool:
        """Whether a busy reading shows every request in flight holding the new size, the oldest
        among them too, where the size from before alone is more than the card holds beyond the
        least it ever held idle: the oldest arrived after the sizes shrank, and so did every request
        that joined after it. Beyond what the card held idle, not the others' bytes the model holds:
        one from before, running alone, reads as the others' rise, and ours as of the new size."""
        shrunk, per_request, others, idle = self._shrunk, self._per_request, self._baseline, self._idle_floor
        # Not where the oldest in flight arrived after the time the shrink is dated from already
        if not self._old_sizes_may_run() or per_request is None or others is None or idle is None or in_flight <= 0:
            return False
        assert shrunk is not None
        return (in_flight - 0.5) * per_request <= used - others and used - idle < shrunk[1] - 0.5 * per_request

    def _jumped(self, moved_baseline: float) -> bool:
        """Whether the apparent baseline moved by more than three times its median move: a change of
        the card, after which old readings prove nothing (a mix moves it at every reading)."""
        last, self._last_moved_baseline = self._last_moved_baseline, moved_baseline
        if last is None:
            return True
        move = abs(moved_baseline - last)
        self._moves.append(move)
        return move > 3 * statistics.median(self._moves)

    def units_changed(self) -> None:
        """What one slot holds changed (routes got their weights): readings before are in other units,
        and the levels OOMs barred were another load. The estimates stay (the scale is kept), but for a
        size an OOM named: the readings' from before it comes back."""
        self._routes_weighed = True
        self._sizes_changed()  # and more: the line's readings, the hollow ones, the size from before
        self._recent.clear()
        self._hollow.clear()
        self._size_before = None
        self._unit_held = None  # a unit's bytes by its cost: a slot is a weighed request now
        self.ooms.forget()
        if self._size_read is not None:
            # A size an OOM named was one request's, of whichever route: a slot is the mean request now.
            self._per_request, self._size_read, self._size_floor = self._size_read, None, None

    def reshaped(self, per_slot_bytes: float) -> None:
        """A `cost` now weighs a part per request beside its units (`CostShape`), and a slot holds
        `per_slot_bytes` by the fit that found it: readings before are in other slots, and the levels
        OOMs barred were another load. Unlike route weights, the cost still tells what a request
        holds, so a unit is still at least what a reading shows one holding (the fit's to begin with)."""
        self._sizes_changed()
        self._recent.clear()
        self._hollow.clear()
        self._size_before = None
        self._size_read = self._size_floor = None
        self.ooms.forget()
        self._per_request = max(MIN_REQUEST_FRACTION * self._total_bytes, per_slot_bytes)
        self._spread_sq = 0.0
        # The most a unit holds, as the fit read it off the readings where every request had allocated: the
        # readings after it catch some before they allocate, and read alone, the size fell under the fit's.
        self._unit_held, self._held_top, self._held_readings = self._per_request, 0.0, 0

    def _changed(self) -> None:
        """The card changed: no line through readings from before and after. The shares stay."""
        self._since_shrink = 0

    def _sizes_changed(self) -> None:
        """Our requests changed size: their shares from before describe other requests. (Not the most a
        unit held where told: readings that catch requests before they allocate pass for a shrink, and it
        goes only when the readings stop showing it, `_watch_unit_held`.)"""
        self._changed()
        self._since_sizes = 0
        self._shares.clear()
        self._shrunk = self._quantile = self._late_size = self._not_whole = None

    def _relieve(self, baseline: float, used: float, in_flight: float, read: float | None) -> None:
        """The others hold less than believed, or our requests less: taken when `RELIEF_READINGS`
        readings in a row agree, at the most cautious of them (fewer mistake the moment between a
        request's admission and its allocation for room). `read`: the others' bytes by the own count."""
        pending = self._pending_relief
        pending.append((baseline, read, used, in_flight))
        if len(pending) < RELIEF_READINGS:
            return
        relieved = max(b for b, *_ in pending)
        reads = [r for _, r, *_ in pending if r is not None]
        readings = [(u, n) for *_, u, n in pending]  # (used, in flight) of each
        pending.clear()
        # Below what the card held idle, or the others as the own count read them: ours hold less
        floor = self._others_floor(relieved, reads)
        if relieved >= floor:
            self._baseline, self._anchored = relieved, False
        elif used - floor < MIN_REQUEST_FRACTION * self._total_bytes:
            # Ours hold nothing at all: admitted and not started (a stalled loop), not smaller.
            self._baseline, self._anchored = floor, True
        elif self._size_read_lately(floor) or self._whole_of_a_known_size(floor, readings):
            # Slots between a request's admission and its allocation, not requests that shrank.
            self._baseline, self._anchored = floor, True
        else:
            # Our requests hold less: the sizes shrank. A shrink read in steps is one, from the size
            # its first step came from (`_shrunk`); the size from before is kept only where it held a
            # while (`SETTLED_READINGS`).
            shrunk = self._shrunk
            before = self._per_request if self._sizes_settled() else None
            mix = self.is_mix()  # a mix's small ones read together: no size from before to weigh
            last_step, self._shrink_step_at = self._shrink_step_at, self.samples
            confirmed = self._shrink_confirmed(last_step)
            whole = confirmed and shrunk is not None and not mix and not self._old_sizes_may_run()
            self._sizes_changed()
            if shrunk is not None and (before is None or before <= (1 + MIX_SPREAD) * shrunk[2]):
                # A later step keeps its first step's record; not where the sizes grew past the least
                # read since by more than a mix's spread: that is another shrink.
                before = shrunk[1]
            elif before is not None and self._oldest_s is not None and not mix:
                shrunk = (self._oldest_s, before, before)
            else:
                shrunk = None
            self._baseline, self._anchored = floor, True
            assert self._per_request is not None
            # The most cautious of the readings that agreed: one of them may have caught slots unallocated
            share, read_in_flight = max(((u - floor) / n, n) for u, n in readings)
            self._per_request += (1.0 if whole else SHARE_SHRUNK) * (share - self._per_request)
            self._size_before, self._shrunk = before, shrunk  # the least size read since: at each reading
            self._add_share(share, read_in_flight)

    def _shrink_confirmed(self, last_step: int | None) -> bool:
        """Whether this step of a shrink comes at the very next pair of readings after the last (at
        reading `last_step`): then it is taken whole, not a quarter of the way."""
        return last_step is not None and self.samples - last_step <= RELIEF_READINGS

    def _others_floor(self, relieved: float, reads: list[float]) -> float:
        """The least the others may hold after a fall to `relieved`, `reads` their bytes by the own count
        over it. Where it read them at both (its rest not risen: a request's tensors not freed yet) nearer
        where they were believed than `relieved`, the least it read: our requests hold less, not the
        others. Where it read them fall, the most it read if below what the card held idle (a neighbour
        there then has left); the least, if above (a neighbour that came since kept that much, which
        would else be read as our requests'); else what the card held idle."""
        idle, baseline = self._idle_floor or 0.0, self._baseline
        if self._own_rest_rose or baseline is None or len(reads) < RELIEF_READINGS:
            return idle
        least = min(reads)
        return max(idle, least) if least > (baseline + relieved) / 2 else min(max(reads), max(idle, least))

    def _whole_of_a_known_size(self, floor: float, readings: list[tuple[float, float]]) -> bool:
        """Whether each of the (used, in flight) `readings` showed, beside the others' `floor`, a whole
        number of a size an OOM named after such readings had been taken for a shrink (`learn_size`), or
        else of the size the readings have held whole numbers of for a while (`_settled_whole`), or (one
        size, not a mix) of a size an OOM named lately (`_whole_of_a_named_size`), or of the size itself
        while the sizes are learnt (the first ten readings since they changed) or where the readings since
        caught requests short by different numbers (`_caught_short`): the requests of that size caught
        before they allocate, again (a shrink falls on whole numbers of the size before only by chance, and
        the next pair that does not takes it)."""
        size = self._late_size or self._settled_whole()
        if size is None and not self.is_mix():
            if self._whole_of_a_named_size(floor, readings):
                return True
            learning = not self._sizes_settled() or self._caught_short(floor)
            size = self._per_request if learning else None
        return size is not None and _all_whole(readings, floor, size)

    def _whole_of_a_named_size(self, floor: float, readings: list[tuple[float, float]]) -> bool:
        """Whether each of the (used, in flight) `readings` holds a whole number of the size an OOM named in
        the last `WINDOW_READINGS` readings: requests of that size caught before they allocate, not a shrink
        (which falls on whole numbers of it only by chance). Taken for a shrink, such a pair after the
        worker's crash that followed the OOM of inputs that grew threefold brought the size back down, and
        the limit from three to ten, where three fit: a second OOM (`--family late`, seed 33)."""
        named = self._named_lately()
        return named is not None and _all_whole(readings, floor, named)

    def _caught_short(self, floor: float) -> bool:
        """Whether the busy readings since the sizes last changed, before the last pair, caught our
        requests (beside the others' `floor`) short of the size by different whole numbers, some by one
        at least: requests caught before they allocate, more of them at some readings than at others.
        Also once four readings have taught a size: the pair that came as the sizes settled, four of five
        allocated twice after a reading of all five, took 3 GiB requests for 2.4 GiB ones, and a sixth let
        in ran out (`late-start`, seed 8, with 32 clients). Requests that shrank to whole numbers of the
        size before stay as short, reading after reading: then one of the readings must be fewer short
        than the one before (short by none, then by one from the change on is a shrink: `shrink`, with 32 clients,
        0.95 of the reader where 0.99, were the step taken for requests caught short). Not before: the
        first readings catch more short one after another as requests arrive (`--family late`, seed
        7028, with 32 clients: an OOM more, 0.96 of the reader where 0.99)."""
        size = self._per_request
        assert size is not None
        since = list(self._recent)[-self._since_sizes : -RELIEF_READINGS] if self._since_sizes > RELIEF_READINGS else []
        shorts = [round(n - (used - floor) / size) for _, n, used in since if n > 0]
        back = self._quantile is None or any(later < earlier for earlier, later in itertools.pairwise(shorts))
        return len(set(shorts)) > 1 and max(shorts) > 0 and back

    def _size_read_lately(self, floor: float) -> bool:
        """Whether a reading within `SHRINK_SERVICES` service times before the last `RELIEF_READINGS`
        showed our requests (beside the others' `floor`) holding at least their mean less a spread each,
        or, of one size, a request's worth more than the last readings' share says (`_pair_share`)."""
        if self._service_s is None or self._per_request is None:
            return False  # none served yet: no time to look back over
        least = self._per_request - math.sqrt(self._spread_sq)
        lately = list(self._recent)[-(SHRINK_READINGS + RELIEF_READINGS) :]
        if len(lately) < RELIEF_READINGS:
            return False
        since_s = lately[-RELIEF_READINGS][0] - SHRINK_SERVICES * self._service_s
        share = self._pair_share(lately[-RELIEF_READINGS:], floor)
        return any(
            t >= since_s and n > 0 and used - floor + READING_GRAIN_BYTES >= min(least * n, share * n + least)
            for t, n, used in lately[:-RELIEF_READINGS]
        )

    def _pair_share(self, pair: list[tuple[float, float, float]], floor: float) -> float:
        """The most one request held at the (time, in flight, used) readings of a pair that says our requests
        hold less; `math.inf` in a mix (whose readings hold different sizes) or with none in flight. Requests
        that allocate late are caught with a different number of them allocated at each reading: a reading
        just before that held a request's worth more at that share is such a catch, not a shrink. Read as
        one, 7 of 9 allocated after 8 of 9 (none ever read with all nine allocated) took the size down a
        step and let a tenth in (`--family late`, seed 50, 32 clients)."""
        shares = [(used - floor) / n for _, n, used in pair if n > 0]
        return math.inf if self.is_mix() or not shares else max(shares)

    def served(self, latency_s: float) -> None:
        """A request finished `latency_s` after its admission: how long one holds its slot."""
        self._served_since = True
        if not 0 <= latency_s < math.inf:
            return  # no time a request could take (NaN too)
        if self._service_s is None:
            self._service_s = latency_s
        else:
            self._service_s += SERVICE_SHARE * (latency_s - self._service_s)

    def _add_share(self, share: float, in_flight: float) -> None:
        """One reading of the mean bytes of `in_flight` requests: the mean moves up fast and down
        slowly, and the spread is that of the readings above it since the sizes last changed."""
        if self._per_request is not None and share < HOLLOW_SHARE * self._per_request:
            # Requests that hold next to nothing (not allocated yet, or failing) teach no size;
            # `SETTLED_READINGS` in a row with no OOM between them are requests that small.
            if share * in_flight < MIN_REQUEST_FRACTION * self._total_bytes:
                self._hollow.clear()  # nothing held at all: a stalled loop's, not small requests
                return
            self._hollow.append((share, in_flight))
            if len(self._hollow) >= SETTLED_READINGS:
                self._sizes_changed()
                most = max(s for s, _ in self._hollow)  # the most cautious of them
                self._per_request = max(MIN_REQUEST_FRACTION * self._total_bytes, most)
                self._size_read = None
                self._shares.extend(self._hollow)
                self._spread_sq = 0.0  # none above the most cautious: the spread is learned anew
                self._hollow.clear()
            return
        self._hollow.clear()
        self._size_read = None
        self._shares.append((share, in_flight))
        self._unit_seen(share)
        if self._per_request is None:
            self._per_request = share
        else:
            weight = SHARE_UP if share > self._per_request else SHARE_DOWN
            self._per_request += weight * (share - self._per_request)
        self._per_request = max(MIN_REQUEST_FRACTION * self._total_bytes, self._per_request)
        self._fit_shares()

    def _unit_seen(self, share: float) -> None:
        """Where told by a `cost` alone, a busy reading showed a unit holding `share`: every unit holds at
        least that. A cost makes the units one size, so a reading shows a unit holding less (some caught
        before they allocate) but never more; sized by nine in ten readings, or by a line through them, a
        unit falls short where most requests in flight have not allocated yet."""
        if not self._costs_told or self._routes_weighed:
            return
        if self._unit_held is None or share > self._unit_held:
            self._unit_held, self._held_top, self._held_readings = share, 0.0, 0

    def _share_quantile(self) -> float | None:
        """`SIZE_QUANTILE` of what the readings since the sizes last changed showed one request holding."""
        if len(self._shares) < MIN_QUANTILE_READINGS:
            return None
        ranked = sorted(share for share, _ in self._shares)
        return ranked[int(SIZE_QUANTILE * len(ranked))]

    def _whole_size(self) -> float | None:
        """The least size, no smaller than any share read since the sizes last changed, of which every
        such reading showed its requests holding a whole number (`WHOLE_TOLERANCE`), one at least fewer
        than were in flight: requests of that one size, some of them caught before they allocate, however
        far that makes the readings swing. None where there is none: a mix, whose sums fall anywhere (or
        whole by chance, till an OOM asks for another size: `learn_size`), or slots that are not whole
        requests (routes weighed, `cost`)."""
        size = _least_whole(self._shares)
        return None if size is None or self._vetoed(size) else size

    def _vetoed(self, size: float) -> bool:
        """Whether an OOM asked for another size than `size` while the readings held whole numbers of it."""
        top = max(self._shares)[0]
        return self._not_whole is not None and abs(size - self._not_whole) <= WHOLE_TOLERANCE * top

    def _fit_shares(self) -> None:
        """The spread of one request's bytes, from the readings above the mean: a mean of n requests
        strays by spread / sqrt(n), so n * deviation^2 is one sample of one request's variance."""
        mean = self._per_request
        if not self._shares or mean is None:
            return
        above = [n * (share - mean) ** 2 for share, n in self._shares if share > mean]
        self._spread_sq = 2 * sum(above) / len(self._shares)  # the half above the mean, for both halves

    def _fit_recent(self) -> bool:
        # A line across a change of the card is no line: only the readings since, as (in flight, used).
        readings = list(self._recent)
        recent = [(x, y) for _, x, y in readings[max(0, len(readings) - self._since_shrink) :]]
        n = len(recent)
        if n < 8 or self._rise is not None or self._own_count_rose(*recent[-1]):
            return False  # a rise (the own count's, or one not confirmed yet) is the others', not the line's
        mean_x = sum(x for x, _ in recent) / n
        mean_y = sum(y for _, y in recent) / n
        var_x = sum((x - mean_x) ** 2 for x, _ in recent) / n
        most_common = max(Counter(x for x, _ in recent).values())
        if var_x < 0.1 or most_common > 0.875 * n or n - most_common < 2:
            return False  # in-flight barely varied: a few stray readings would set the slope
        slope = sum((x - mean_x) * (y - mean_y) for x, y in recent) / n / var_x
        if slope < MIN_REQUEST_FRACTION * self._total_bytes:
            return False
        intercept = mean_y - slope * mean_x
        if intercept < 0:
            return False
        if self._idle_floor is not None and intercept < self._idle_floor - 0.25 * slope:
            # The others below what the card ever held idle: readings of requests not allocated yet
            # tilted the line.
            return False
        residual_sq = sum((y - intercept - slope * x) ** 2 for x, y in recent) / n
        newest_x, newest_y = recent[-1]
        if newest_y - intercept - slope * newest_x > max(0.5 * slope, 3 * math.sqrt(residual_sq)):
            return False  # the newest holds more than the line says: the others rose, read against the model
        # Through two neighbouring levels only, a line must be clean: through a mix's it points anywhere.
        narrow = max(x for x, _ in recent) - min(x for x, _ in recent) < 2
        if residual_sq > ((0.05 if narrow else 0.25) * slope) ** 2:
            return False  # not one line: the window straddles a change (sizes, a neighbour); wait it out
        lowest_used = min(y for _, y in recent)
        self._baseline = min(lowest_used, intercept)
        self._per_request, self._size_read = slope, None
        self._spread_sq = residual_sq / max(1.0, mean_x)  # y strays by sqrt(n) times one request's spread
        return True

    def estimate(self) -> MemoryEstimate | None:
        if self._per_request is None or self._baseline is None:
            return None
        floor = self._size_floor
        per_request = self._per_request if floor is None else max(self._per_request, floor[0])
        spread = math.sqrt(self._spread_sq)
        if self._whole is not None:
            per_request = max(per_request, self._whole)  # one size, read whole where all had allocated
        elif self._quantile is not None and (spread < MIX_SPREAD * self._per_request or self.told()):
            per_request = max(per_request, self._quantile)  # one size: readings before their peak are not it
        if self._unit_held is not None:
            per_request = max(per_request, self._unit_held)  # told: the most a unit was seen holding
        return MemoryEstimate(self._baseline, per_request, self._total_bytes, spread)

    def room(self) -> float | None:
        """How many requests of the mean size the card has room for under target, as a fraction."""
        est = self.estimate()
        if est is None:
            return None
        return (self.target_utilisation * est.total_bytes - est.baseline_bytes) / est.per_request_bytes

    def cap(self, now_s: float | None = None) -> int | None:
        """How many requests fit under `target_utilisation` of the card beside the others' bytes, or
        None if not known yet; at `now_s`, below any level an OOM showed not to fit in this room.
        Not in a mix: there an OOM is its large ones meeting, which the tail planned for answers."""
        est = self.estimate()
        if est is None:
            return None
        room_bytes = self.target_utilisation * est.total_bytes - est.baseline_bytes
        # Slack (`FIT_SLACK`): a fit of exactly n, estimated a hair short, must not floor to n - 1.
        slack_bytes = FIT_SLACK * est.per_request_bytes
        n = max(0, math.floor((room_bytes + slack_bytes) / est.per_request_bytes))
        # The tail is planned for in a mix only: below `MIX_SPREAD` the spread is the readings' noise.
        tail_bytes = self.z * est.spread_bytes if self.is_mix() else 0.0
        while n > 0 and n * est.per_request_bytes + tail_bytes * math.sqrt(n) > room_bytes + slack_bytes:
            n -= 1
        if now_s is None or self.is_mix():
            return n
        barred = self.ooms.barred_from(now_s, room_bytes / est.per_request_bytes)
        return n if barred is None else min(n, barred - 1)

    def failed(self, now_s: float) -> None:
        """A request ran out of memory at `now_s`. The readings of the last service time counted it in
        flight while it held nothing (its allocation failed, the error came later): they leave the
        line, which they tilted."""
        self._hollow.clear()
        if self._service_s is None:
            return
        since_s = now_s - self._service_s
        while self._recent and self._recent[-1][0] >= since_s:
            self._recent.pop()
            self._since_shrink = max(0, self._since_shrink - 1)

    def mix_oom(self) -> None:
        """A pile-up of large requests that the spread explains (`explains`): plan for a heavier tail."""
        self.z = min(MAX_Z, self.z + Z_STEP)

    def mix_success(self) -> None:
        """A request answered: the tail planned for may be a little lighter, down to `MIN_Z`."""
        if self.z > MIN_Z:
            self.z = max(MIN_Z, self.z - Z_STEP * MIX_OOM_SHARE / (1 - MIX_OOM_SHARE))

    def costs_told(self) -> None:
        """A request came with a `cost` other than 1: slots weigh what the gate was told (`told`)."""
        self._costs_told = True

    def told(self) -> bool:
        """Whether slots weigh what the gate was told (a `cost`, or route weights). Then a slot's bytes are
        one size by what it was told: readings that spread are slots caught before they allocate, not a
        mix (whose OOMs bar no level), and an OOM names a unit's bytes."""
        return self._costs_told or self._routes_weighed

    def is_mix(self) -> bool:
        """Whether the requests' sizes vary (a spread of more than `MIX_SPREAD` of their mean, where the
        readings are not whole requests of one size, and the gate was told no weights): then an OOM is
        their large ones meeting (`mix_oom`), not a level that stopped fitting (`OomStates`)."""
        est = self.estimate()
        if est is None or self.told():
            return False
        return self._whole is None and est.spread_bytes >= MIX_SPREAD * est.per_request_bytes

    def never_fits(self, nbytes: float) -> bool:
        """Whether an allocation of `nbytes` is more than the card has beside the others' bytes, with
        nothing of ours in flight: no load could have avoided its OOM."""
        est = self.estimate()
        return est is not None and nbytes > est.total_bytes - est.baseline_bytes

    def learn_size(self, nbytes: float, units: float, now_s: float) -> bool:
        """An allocation of `nbytes` failed in a request of `units` at `now_s`. Where the requests were
        of one size and this is beyond it (three spreads above the mean), inputs grew: a request holds
        at least that much from now on (True), while requests from before may run (`oldest_in_flight`).
        So too where they were of one size until the last readings and this is beyond a mix's spread of
        the mean, or past what the window's readings showed one holding where the own count read them
        holding more (`_past_the_readings`). In a mix, a large one failing says nothing new."""
        per_unit = nbytes / max(units, 1e-9)
        self._named.append((self.samples, per_unit))
        whole = self._whole
        if whole is not None and abs(per_unit - whole) > WHOLE_TOLERANCE * whole and not self._one_size_for_a_window():
            # Another size than the readings hold whole numbers of: a mix whose sums fell whole (sizes
            # of 1.5 and 6 GiB, three at a time, hold 4.5, 9, 13.5 or 18)
            self._whole, self._not_whole, self._one_size_at = None, whole, None
        est = self.estimate()
        if est is None:
            return False
        if per_unit > est.total_bytes - est.baseline_bytes:
            return False  # no slot that size would fit, yet the request alone would: its weight is wrong, not the size
        if self.is_mix() and self._named_whole(per_unit):
            return True
        # Settled since the sizes last changed, not the card (growth is first read as the others'
        # rise); or soon after a shrink, a size past the one from before by more than a mix's spread, or
        # short of it (`_shrank_to`).
        before = self._size_before
        settled = (
            self._sizes_settled()
            or (before is not None and per_unit > (1 + MIX_SPREAD) * before)
            or self._shrank_to(per_unit)
        )
        uniform = est.spread_bytes < MIX_SPREAD * est.per_request_bytes
        # One size until the last readings: the spread they showed is larger ones among the others, and a
        # size beyond a mix's spread of the mean is the inputs that grew.
        lately = self._one_size_lately()
        beyond = 3 * est.spread_bytes if uniform else MIX_SPREAD * est.per_request_bytes
        past = self._past_the_readings(per_unit, est.per_request_bytes)
        grew = settled and (per_unit > est.per_request_bytes + beyond or past)
        misread = self._shrink_misread(per_unit, est.per_request_bytes)
        if (uniform or lately) and (grew or misread):
            if self._size_read is None:
                self._size_read = self._per_request
            self._per_request = per_unit
            self._size_floor = (per_unit, now_s)
            self._sizes_changed()  # readings from before were of smaller requests
            if misread:
                self._late_size = per_unit  # readings of it catch some not allocated yet (`_relieve`)
            return True
        return False

    def _one_size_for_a_window(self) -> bool:
        """Whether the requests were of one size until the last readings, for two windows of readings or more:
        an OOM that names another size than they hold whole numbers of is then inputs that grew, not a mix
        whose sums fell whole (which reads as one size for a few readings at a time; two windows, where a
        wrong call takes a mix for requests of its large size). Taken for such a mix,
        inputs that grew threefold, allocating late, were never learnt: every OOM after it named the new
        size of a mix's tail, one a second for thirty seconds (`--family late`, seed 7048)."""
        return self._one_size_lately() and self._one_size_readings() >= 2 * WINDOW_READINGS

    def _one_size_lately(self) -> bool:
        """Whether the requests were of one size until the last readings (`RELIEF_READINGS`)."""
        one_size_at = self._one_size_at
        return one_size_at is not None and self.samples - one_size_at <= RELIEF_READINGS

    def _one_size_readings(self) -> int:
        """How many readings the last stretch of one size lasted (0: none yet, or ended by an OOM's size)."""
        one_size_at = self._one_size_at
        return 0 if one_size_at is None else one_size_at - self._one_size_from

    def _shrank_to(self, per_unit: float) -> bool:
        """Whether `per_unit`, an allocation an OOM named soon after a shrink, is short of the size from before
        by more than a mix's spread: the shrink was to that, and the readings that read it smaller caught
        requests not allocated yet (`--family late`, seed 7059: 55 OOMs in a minute where 12, the size read at
        a fraction of what they hold while it settled)."""
        before = self._size_before
        return before is not None and per_unit < (1 - MIX_SPREAD) * before

    def _past_the_readings(self, per_unit: float, per_request: float) -> bool:
        """Whether `per_unit`, an allocation an OOM named, is more than the model's size and than any share of
        one request the window holds (`_shares`), where the own count read ours holding more than the model at
        the last readings: inputs that grew, however far the readings of the change spread (requests that all
        grow stray together, not as many apart: a growth of a fifth read as three spreads). Not where routes
        are weighed: a request weighed before its route's weight names a whole request's bytes as a slot's."""
        more = self._more_at is not None and self.samples - self._more_at < RELIEF_READINGS
        most = max((share for share, _ in self._shares), default=math.inf)
        return more and not self._routes_weighed and per_unit > (1 + WHOLE_TOLERANCE) * max(most, per_request)

    def _whole_run(self) -> None:
        """Read as a mix where the requests were of one size lately, for a window of readings or more (a mix
        may read as one size for a few): where the last `SETTLED_READINGS` readings each hold a whole number
        of one size (the least, as `_whole_size` finds it), the readings across a change of size made the
        mix, and the requests are of that size now, as where an OOM named it (`_named_whole`, `_take_whole`).
        Waiting for that OOM, a mean short of either size let in more than fit, reading after reading."""
        if self._one_size_readings() < WINDOW_READINGS or len(self._shares) < SETTLED_READINGS:
            return  # one size for a window of readings before, not a mix that read whole for a while
        size = _least_whole(list(self._shares)[-SETTLED_READINGS:])
        if size is not None and not self._vetoed(size):
            self._take_whole(size)

    def _named_lately(self) -> float | None:
        """The most an OOM named a unit asking for in the last `WINDOW_READINGS` readings, or None."""
        named = self._named
        while named and self.samples - named[0][0] >= WINDOW_READINGS:
            named.popleft()
        return max((nbytes for _, nbytes in named), default=None)

    def _named_whole(self, size: float) -> bool:
        """`_take_whole(size)` for `size`, an allocation an OOM named."""
        return self._take_whole(size)

    def _take_whole(self, size: float) -> bool:
        """Whether the readings read as a mix end in `SETTLED_READINGS` or more in a row that each hold a
        whole number of `size` (none more than `size` a request in flight, some less), where the requests
        were one size ten readings before those began: requests of the one size `size`, caught before they
        allocate, after the sizes changed (the readings across the change made a mix, whose mean is short
        of the size). Then it is their size. Not a mix all along: its sizes may be whole numbers of one
        another."""
        run: list[tuple[float, float]] = []
        for share, n in reversed(self._shares):
            whole = n == round(n) and _off_whole(share * n, size) <= WHOLE_TOLERANCE * size
            if not whole or share > (1 + WHOLE_TOLERANCE) * size:
                break
            run.append((share, n))
        if len(run) < SETTLED_READINGS or not any(round(share * n / size) < n for share, n in run):
            return False
        if self._one_size_at is None or self.samples - self._one_size_at > len(run) + SETTLED_READINGS:
            return False
        self._sizes_changed()
        self._shares.extend(reversed(run))
        self._per_request, self._size_read, self._spread_sq = size, None, 0.0
        self._late_size = size  # readings of it catch some not allocated yet (`_relieve`)
        return True

    def _watch_unit_held(self, in_flight: float, used: float) -> None:
        """The most a unit was seen holding holds while the readings still show a unit near it: where none
        of `WINDOW_READINGS` busy readings in a row showed a unit holding `HELD_SHARE` of it, the sizes shrank
        (or the request that showed it was an outlier), and it goes: kept, it would hide any shrink. Where
        every one of them showed a unit holding one smaller size (within `WHOLE_TOLERANCE`), each caught every
        unit allocated, and that size replaces it: a unit holds that now."""
        if self._unit_held is None or in_flight <= 0 or self._baseline is None:
            return
        share = (used - self._baseline) / in_flight
        self._held_top = max(self._held_top, share)
        self._held_low = share if self._held_readings == 0 else min(self._held_low, share)
        self._held_readings += 1
        if self._held_readings < WINDOW_READINGS:
            return
        top, low = self._held_top, self._held_low
        if top < HELD_SHARE * self._unit_held:
            self._unit_held = None
        elif low >= (1 - WHOLE_TOLERANCE) * top and top < (1 - WHOLE_TOLERANCE) * self._unit_held:
            self._unit_held = top  # one smaller size at every reading: the units shrank
        self._held_top, self._held_readings = 0.0, 0

    def _shrink_misread(self, per_unit: float, per_request: float) -> bool:
        """Whether an allocation of `per_unit` says the last shrink was misread: no request from before
        it runs by the model, yet one asked for the size from before (within a mix's spread). Readings
        that caught requests before they allocated, two pairs in a row, pass for a shrink."""
        shrunk = self._shrunk
        if shrunk is None or self._old_sizes_may_run() or per_unit <= per_request:
            return False
        return per_unit >= (1 - MIX_SPREAD) * shrunk[1]

    def oldest_in_flight(self, arrived_s: float | None) -> None:
        """When the oldest request in flight arrived (None: none that could be from before), before a
        reading. A size an OOM named holds until every request in flight arrived after it: readings of
        requests from before (smaller) would bring it down, and the next of the new size to an OOM."""
        self._oldest_s = arrived_s
        floor = self._size_floor
        if floor is not None and (arrived_s is None or arrived_s >= floor[1]):
            self._size_floor = None
            if self._per_request is not None:
                self._per_request = max(self._per_request, floor[0])

    def heavier_before(self) -> tuple[float, float] | None:
        """Where the sizes shrank and had been settled before: when the oldest request read at the new
        size arrived, and how many of the new sizes one from before holds (at least 1). The gate weighs
        a request that arrived before then so while it waits."""
        shrunk, per_request = self._shrunk, self._per_request
        if shrunk is None or per_request is None or self.is_mix():
            return None  # in a mix, the large ones are the tail the cap plans for, not ones from before
        return shrunk[0], max(1.0, shrunk[1] / per_request)

    def explained_by_size(self, level: float, nbytes: float, units: float = 1) -> bool:
        """Whether `level` units in flight, one request of `units` among them asking for `nbytes`,
        overflow the room only because of that request's size (a large one from before the sizes
        shrank): then the OOM says nothing of how many of the model's requests fit. A size within a
        mix's spread of the model's explains nothing: the model is short, and its level is barred."""
        est = self.estimate()
        if est is None or nbytes <= (1 + MIX_SPREAD) * units * est.per_request_bytes:
            return False
        room_bytes = self.target_utilisation * est.total_bytes - est.baseline_bytes
        return (level - units) * est.per_request_bytes + nbytes > room_bytes >= level * est.per_request_bytes
