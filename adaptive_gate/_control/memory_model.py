"""One model of the card's memory: the others' bytes, our requests' bytes, and what OOMs taught.

What the card holds is the others' bytes (weights, the CUDA context, caches, neighbour processes)
plus each of our requests' bytes. The manual recipe is "measure used memory with nothing running,
then with one request, and take the difference". `MemoryModel` does it continuously from (in
flight, used) readings, and follows a neighbour process, inputs that grow and a mix of sizes. The
limit is what fits: the requests in flight (committed, whether they have allocated yet or not) and
one more, beside the others' bytes, under `target_utilisation` of the card.

An out-of-memory error says the model was wrong about the card as it was then: that so many did
not fit in the room the readings showed. It is kept as such (`OomStates`): that level does not
fit while the card is no roomier than then, and comes back the moment the readings say the card
changed (a neighbour left, inputs shrank), with no timer to wait out.

Like the controllers it is arithmetic on observations: the time is passed in, so the simulator
replays it exactly.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from dataclasses import dataclass

from .._checks import check_fraction
from .oom_states import FIT_SLACK, OomStates

__all__ = ["BLIND_GROWTH_AFTER_SAMPLES", "MemoryEstimate", "MemoryModel", "OomStates"]


@dataclass(frozen=True)
class MemoryEstimate:
    baseline_bytes: float  # the others' bytes: what the card holds with none of ours in flight
    per_request_bytes: float
    total_bytes: int
    spread_bytes: float = 0.0


# Readings in a row that must show room coming back before it is believed: two sample periods.
RELIEF_READINGS = 2
# Where readings show our requests hold less, a reading at the size believed within this many of a
# request's service times before them (`SHRINK_READINGS` readings at most) says they caught slots
# between a request's admission and its allocation (or its freeing and its release), not requests
# that shrank: in real time, 30 ms requests read every 10 ms are caught so two readings in a row
# every second or so. Readings further apart than that catch other requests each.
SHRINK_SERVICES = 1.5
SHRINK_READINGS = 8
SERVICE_SHARE = 0.1  # how far one request's service time moves their mean
MIN_MOVES = 8  # readings whose moves must be known before their median says how far a mix moves
NOISE_SPREADS = 2.0  # how far (in spreads of the sum of n requests) a reading may stray from the model
WINDOW_READINGS = 32  # readings a fit, or the requests' spread, look back over (3.2 s)
# How far one reading moves the requests' mean bytes: twice as far up as down, so that the mean
# sits a little above the middle (a third of the readings above it): readings below are as often
# requests not yet allocated as small ones.
SHARE_UP, SHARE_DOWN = 0.2, 0.1
# Where requests are of one size, a request holds at least this quantile of what the readings since
# the sizes last changed showed each holding (`MIN_QUANTILE_READINGS` of them at least): readings catch
# requests before their peak (admitted and not allocated yet, early in their work), and the mean sat
# below it. Requests that allocated up to half their work late were taken for 2.7 GiB where 3 are, a
# sixth was let in, and in real time it ran out of memory two or three times in ten seconds.
SIZE_QUANTILE = 0.9
MIN_QUANTILE_READINGS = 4
OWN_SHARE = 0.5  # the least of its requests' bytes the process's own count must show to be believed
HOLLOW_SHARE = 0.25  # a reading whose requests hold less than this of the mean each teaches no size
SHARE_SHRUNK = 0.25  # where two readings in a row say requests hold less than the others' bytes allow
# The least a request (or unit of cost) is taken to hold, as a share of the card: > 0, or a reading
# where used memory did not move would size a request at 0 bytes and the room at a division by zero.
MIN_REQUEST_FRACTION = 0.001
# Readings since the card last changed after which the requests' spread is known well enough to
# call them of one size, and an allocation beyond it a change of sizes.
SETTLED_READINGS = 10
# A mix's pile-ups: the share of its requests that may meet one, and how far one moves the tail
# planned for (`z`, in spreads). At a share of 5%, a quarter of large requests four times the small
# ones runs at the level a hand-tuned semaphore would pick, with the OOMs that semaphore has.
MIX_OOM_SHARE = 0.05
MIX_SPREAD = 0.25  # a spread of more than this share of the mean makes the requests a mix
Z_STEP = 0.25
MIN_Z, MAX_Z = 1.0, 6.0
# Busy samples after which a model that still has no cap (requests that hold next to nothing on the
# card) stops holding growth back.
BLIND_GROWTH_AFTER_SAMPLES = 20


class MemoryModel:
    """The others' bytes and the bytes each request adds, learned from (in-flight, used) readings.

    * A reading with nothing of ours in flight is exactly what the others hold.
    * When in-flight varied over the recent readings (since the card last changed: a line across a
      change is no line) and they lie on one line, a least-squares fit gives both at once: its
      intercept is the others' bytes, its slope one request's.
    * Otherwise a busy reading within the requests' usual spread of the model teaches their mean
      (up twice as fast as down: `SHARE_UP`, `SHARE_DOWN`) and spread (over the readings since
      their sizes last changed, `WINDOW_READINGS` at most), while the others' bytes are anchored.
      Where they are of one size, a request holds at least what nine in ten of those readings showed
      one holding (`SIZE_QUANTILE`): readings catch requests before their peak.
    * A rise beyond that spread is taken for the others' (a neighbour, a leak, a fatter input) and
      believed at once: the room shrinks before the next admission, not after an OOM; a fit over
      levels, or an idle reading, tells later whose bytes they were. A fall is believed once
      `RELIEF_READINGS` readings in a row show it (fewer may be requests admitted and not yet
      allocated), at the most cautious of them.

    Requests of different sizes (a mix the gate cannot tell apart) are described by a mean and a
    spread; the cap keeps `others + n * mean + z * sqrt(n) * spread` under target, the sum of n
    such requests: cautious with the large ones, without planning for all of them at once. `z`
    starts at `MIN_Z` and is learned from the pile-ups the spread explains (`mix_oom`,
    `mix_success`): up at each, down a little at each success, so that about `MIX_OOM_SHARE` of a
    mix's requests meet one, whatever the shape of the mix (a normal tail or a quarter of large
    ones). A workload of one size has no tail to plan for: a spread under `MIX_SPREAD` of the mean
    is the readings' noise, and the cap keeps `others + n * mean` under target alone.
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
        # (share of one request, in flight) of the busy readings within the spread since the change
        self._shares: deque[tuple[float, float]] = deque(maxlen=WINDOW_READINGS)
        self._hollow: list[tuple[float, float]] = []  # the hollow readings in a row since the last OOM
        # Lower baselines seen in the last readings: believed when RELIEF_READINGS in a row agree.
        # Each with the others' bytes as the process's own count read them (None: it did not tell).
        self._pending_relief: list[tuple[float, float | None]] = []
        # The last reading's rise of the others' bytes, until the next confirms it: (the others'
        # bytes before it, whether they were anchored then, the share of one request it would be
        # as ours, the requests in flight, the readings since the card last changed before it,
        # whether it came as a jump)
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
        # A size an OOM named (`learn_size`) and when: a request holds at least that much while
        # requests that arrived before it run, which may be of the sizes from before.
        self._size_floor: tuple[float, float] | None = None
        # This process's live bytes with nothing of ours in flight (the last read), and what our
        # requests held by that count at the last reading (None where the probe does not tell).
        self._own_idle: int | None = None
        # Whether that rest rose at the last idle reading after requests had run: a request's
        # tensors not freed yet (weights a lifespan loads come before any request).
        self._own_rest_rose = False
        self._ours: float | None = None
        self._own_agrees = False  # whether that count told our requests' bytes at the last busy reading
        self._oldest_s: float | None = None  # when the oldest request in flight arrived, at the last reading
        # Where the sizes shrank: when the oldest request read at the smaller size arrived, the size
        # from before, and the least size read since. Requests that arrived before then may be of the
        # size from before (`heavier_before`); sizes that grew well past the least are other requests.
        self._shrunk: tuple[float, float, float] | None = None
        # Whether the others rose into a full card (at the last reading, or at one before it and the
        # card read full since, none of ours finished meanwhile): they took all there was, and may
        # want more (a neighbour that arrived on a full card takes each byte we free).
        self.pressed = False
        self._served_since = False  # whether a request of ours finished since the last reading
        self._shrink_step_at: int | None = None  # the reading of the last step of a shrink (`_relieve`)

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
            # want more (a neighbour that came to a full card waits for them; the hold let go at the
            # next reading, before any had finished, and the request let in ran out).
            waiting = self.pressed and not self._served_since
            self.pressed = full and ((self._rise is not None and self._rise is not rise_before) or waiting)
            self._served_since = False
            self._own_agrees = self._own_told(in_flight, float(used_bytes))
            if self._anchored:
                self._anchor = self._baseline
        finally:
            self._quantile = self._share_quantile()
            est = self.estimate()
            self.ooms.observe(now_s, self.room(), 0.0 if est is None else est.per_request_bytes)

    def _read_own(self, in_flight: float, own_bytes: int | None) -> None:
        """What our requests hold by this process's own count, where the probe knows it: its live
        bytes beyond what it held at the last reading with none of ours in flight (the weights, and
        what stays after the first request, such as a workspace). The last, not the least: weights
        loaded after the first reading (a lifespan that loads the model while the sampler runs) are
        the process's at rest. An idle reading that caught a request's tensors not yet freed reads
        ours short, and the card less them disagrees with the model: the count is not believed
        until a reading agrees again (`_own_told`)."""
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
        """Whether the process's own count told our requests' bytes at this busy reading: they showed
        in it, and the card less them was the others' bytes the model holds. Only then is the next
        reading's count believed where it tells another story (`_read_busy`): a framework that
        allocates outside PyTorch's allocator, whose count stands still or shows part of a request,
        never gets there."""
        mean, others = self._per_request, self._baseline
        if self._ours is None or mean is None or others is None:
            return self._own_agrees if in_flight <= 0 else False
        agrees = abs(used - self._ours - others) <= self._own_slack(in_flight)
        return agrees and self._ours >= OWN_SHARE * mean * in_flight

    def _own_slack(self, in_flight: float) -> float:
        """How far the card less our requests' bytes by the process's own count may stray from the
        others' bytes the model holds and still agree with it."""
        assert self._per_request is not None
        return HOLLOW_SHARE * self._per_request + NOISE_SPREADS * math.sqrt(self._spread_sq * in_flight)

    def _own_count_rose(self, in_flight: float, used: float) -> bool:
        """Whether the process's own count, believed (`_own_told`), says the others rose at this busy
        reading."""
        others = self._baseline
        if in_flight <= 0 or self._ours is None or not self._own_agrees or others is None:
            return False
        return used - self._ours - others > self._own_slack(in_flight)

    def _learn(self, now_s: float, in_flight: float, used: float) -> None:
        self.busy_samples += in_flight > 0
        if in_flight <= 0 and self._per_request is not None:
            if any(abs(used - b) > 0.25 * self._per_request for b in (self._baseline, self._anchor) if b is not None):
                # Nothing of ours runs and the others hold another amount than believed, or than last
                # anchored (a rise read only in part, with the card full): the card changed, and a
                # line through readings from before and after would be no line (a neighbour that
                # came during a restart, fitted with the busy readings before it, halved a request).
                self._changed()
        self._recent.append((now_s, in_flight, used))
        self._since_shrink += 1
        self._since_sizes += 1
        shrunk = self._shrunk
        if self._old_sizes_may_run():
            # A request from before the sizes shrank may run: each reading holds one of the old size
            # among the new, and a line through them put the others at 10.25 GiB and a request at
            # 2.25 where 8 and 3 are (six let in where five fit). The line starts once none runs.
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
            return
        self._read_busy(used, in_flight)

    def _read_busy(self, used: float, in_flight: float) -> None:
        """One reading with requests in flight, against the model: the others' rise, their fall, or
        our requests' bytes, within their usual spread. Those are learned only while the others'
        bytes are anchored (read with nothing of ours in flight, or fitted over levels): against a
        rise believed from one level alone, a request's share would be a guess of a guess."""
        assert self._per_request is not None and self._baseline is not None
        if self._baseline > used:
            # What is used holds the others' bytes: they hold no more, whatever was believed (a mix's
            # large requests, read as the others' rise, are gone again): back to what was last
            # anchored, where that fits.
            self._rise = None
            if self._anchor is not None and self._anchor <= used:
                self._baseline, self._anchored = self._anchor, True
            else:
                self._baseline, self._anchored = used, False
        moved_baseline = used - self._per_request * in_flight
        # How far n requests stray in all: twice their spread, or where the apparent baseline moves
        # by GiBs from reading to reading (a mix of sizes whose spread is still being learned),
        # three times its usual move.
        usual_move = statistics.median(self._moves) if len(self._moves) >= MIN_MOVES else 0.0
        noise_bytes = max(NOISE_SPREADS * math.sqrt(self._spread_sq * in_flight), 3 * usual_move)
        # The others' bytes before a rise that the next reading has yet to confirm: the one it read
        # (a rise the own count read is the others', whatever the count in flight says next).
        before = self._baseline if self._rise is None else self._rise[0]
        own_others = used - self._ours if self._ours is not None and self._own_agrees else None
        if own_others is not None and own_others > before + noise_bytes:
            # The others rose, by the process's own count: believed at least as far as it says, where
            # the count in flight hides it (a neighbour took the room of requests that finished, and
            # those admitted into it failed to allocate: they hold nothing, and count as in flight
            # until their OOM is told), and kept at the next reading, where requests that ran out
            # hold nothing and the count in flight reads the rise as gone (it was then taught as
            # our requests' size: 3.9 GiB a request where 3 are, and a limit of three beside room
            # for five after the neighbour left).
            moved_baseline = max(moved_baseline, own_others)
        jumped = self._jumped(moved_baseline)
        rise, self._rise = self._rise, None
        if rise is not None and moved_baseline <= rise[0] + noise_bytes:
            # The last reading's rise is gone at the next: it was our requests (the large ones of a
            # mix), not the others'. Where the others' bytes were anchored, its share is taught.
            self._baseline, self._anchored = rise[0], rise[1]
            if self._anchored:
                # Taught as a request's share where sizes vary, or are not known yet; where they have
                # been one size for a while, it was a blip of the others' (a neighbour's transient).
                if self.is_mix() or rise[4] < SETTLED_READINGS:
                    self._add_share(rise[2], rise[3])
                self._add_share((used - self._baseline) / in_flight, in_flight)
            return
        if rise is not None and rise[5]:
            self._changed()  # a rise that lasts, and came as a jump: the card changed
        rose = moved_baseline > self._baseline + noise_bytes
        if rose and own_others is not None and own_others <= before + noise_bytes and not self._old_sizes_may_run():
            # The process's own count, believed, reads the others where they were: the rise is ours,
            # our requests hold more than the model says (taken for the others' rise, a request size
            # brought down by one that held nothing stayed down, and the others stayed a GiB high).
            # Not while a request from before the sizes shrank may run: that one holds more.
            self._pending_relief.clear()
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
        else:
            self._pending_relief.clear()
            if self._anchored:
                self._add_share((used - self._baseline) / in_flight, in_flight)

    def _old_sizes_may_run(self) -> bool:
        """Whether a request that arrived before the sizes shrank may still run (`heavier_before`)."""
        shrunk = self._shrunk
        return shrunk is not None and self._oldest_s is not None and self._oldest_s < shrunk[0]

    def _jumped(self, moved_baseline: float) -> bool:
        """Whether the apparent baseline moved from the last reading's by more than it usually does
        (three times the median move): a change of the card (a neighbour came, inputs grew), after
        which old readings prove nothing. A mix of sizes moves it on every reading: no change."""
        last, self._last_moved_baseline = self._last_moved_baseline, moved_baseline
        if last is None:
            return True
        move = abs(moved_baseline - last)
        self._moves.append(move)
        return move > 3 * statistics.median(self._moves)

    def units_changed(self) -> None:
        """What one slot holds changed (routes got their weights): in-flight counts read before are
        in other units, and a line across the change would be no line. The estimates stay: a change
        of weights keeps the scale, so a slot holds about the bytes it held. The levels OOMs barred
        are forgotten: so many slots of the old weights were another load."""
        self._recent.clear()
        self._shares.clear()
        self._hollow.clear()
        self._since_shrink = self._since_sizes = 0
        self._size_before = self._shrunk = self._quantile = None
        self.ooms.forget()

    def _changed(self) -> None:
        """The card changed: a line through readings from before and after would be no line. The
        requests' shares stay: each was read against the others' bytes of its time."""
        self._since_shrink = 0

    def _sizes_changed(self) -> None:
        """Our requests changed size: their shares from before describe other requests."""
        self._changed()
        self._since_sizes = 0
        self._shares.clear()
        self._shrunk = self._quantile = None

    def _relieve(self, baseline: float, used: float, in_flight: float, read: float | None) -> None:
        """The others hold less than believed, or our requests less (below 0, no others' bytes
        explain it): taken when `RELIEF_READINGS` readings in a row agree, at the most cautious of
        them. Fewer would mistake the moments between a request's admission and its allocation (or
        between its freeing and its release) for room: at 50 requests a second, two readings in a
        row catch such a moment every few seconds. `read`: the others' bytes as the process's own
        count read them at this reading (None where it did not; `_others_read`)."""
        pending = self._pending_relief
        pending.append((baseline, read))
        if len(pending) < RELIEF_READINGS:
            return
        relieved = max(b for b, _ in pending)
        reads = [r for _, r in pending if r is not None]
        pending.clear()
        others_read = self._others_read(relieved, reads)
        # Below what the card held idle, or the others as the own count read them: ours hold less
        floor = max(self._idle_floor or 0.0, others_read or 0.0)
        if relieved >= floor:
            self._baseline, self._anchored = relieved, False
        elif used - floor < MIN_REQUEST_FRACTION * self._total_bytes:
            # Ours hold nothing at all: admitted and not started (an event loop that stalled), not
            # smaller. Nothing to learn about their sizes.
            self._baseline, self._anchored = floor, True
        elif self._size_read_lately(floor):
            # Slots between a request's admission and its allocation, or its freeing and its release,
            # not requests that shrank: a reading just before showed them at their size. Taken for a
            # shrink, each such pair brought the size down a step and the limit up one, until 1.5 GiB
            # a request was believed where 3 are, and nine ran where five fit.
            self._baseline, self._anchored = floor, True
        else:
            # Below what the card held with nothing of ours in flight, ever: the others did not shrink
            # past that (our own weights and context are in it), so our requests hold less. Two
            # readings say so, not one: the mean comes down faster than one reading would bring it,
            # and the spread is the new sizes'.
            # The size from before, where it had held for a while: sizes that keep changing (large
            # requests of a route not weighed yet, read as growth and then as shrinking) have none.
            # A shrink read in steps (the mean comes down a share at a time) is one, from the size
            # its first step came from: inputs that grew, read as sizes that shrank while the larger
            # ones failed and held nothing, came down in steps at 20 readings a second, and the size
            # their OOMs named was taken for one left from before while a dozen more ran out.
            shrunk = self._shrunk
            before = self._per_request if self._since_sizes >= SETTLED_READINGS else None
            mix = self.is_mix()  # a mix's small ones read together: no size from before to weigh
            last_step, self._shrink_step_at = self._shrink_step_at, self.samples
            confirmed = self._shrink_confirmed(used, last_step)
            whole = confirmed and shrunk is not None and not mix and not self._old_sizes_may_run()
            self._sizes_changed()
            if shrunk is not None and (before is None or before <= (1 + MIX_SPREAD) * shrunk[2]):
                # A later step keeps the size its first step came from, and the first step's record,
                # also one that comes after the sizes held a while: replaced by the size between
                # steps, the line's old requests weighed 1.06 slots where they hold 1.75, and one of
                # them, let in among the new ones, ran out. Not where the sizes grew well past the
                # least read since (by more than a mix's spread): that is another shrink.
                before = shrunk[1]
            elif before is not None and self._oldest_s is not None and not mix:
                shrunk = (self._oldest_s, before, before)
            else:
                shrunk = None
            self._baseline, self._anchored = floor, True
            assert self._per_request is not None
            share = (used - floor) / in_flight
            self._per_request += (1.0 if whole else SHARE_SHRUNK) * (share - self._per_request)
            self._size_before, self._shrunk = before, shrunk  # the least size read since: at each reading
            self._add_share(share, in_flight)

    def _shrink_confirmed(self, used: float, last_step: int | None) -> bool:
        """Whether this step of a shrink comes at the very next pair of readings after the last (taken
        at reading `last_step`), on a card with room: then it is taken whole (four readings in a row say
        so, and no slot caught between a request's admission and its allocation lasts that long), not a
        quarter of the way (inputs that shrank to a seventh took seven seconds to be believed). Not on a
        full card: there, requests that hold nothing are those that failed to allocate, their OOMs not
        told yet (beside a neighbour that came to a full card, each whole step let in another that ran
        out)."""
        roomy = self._total_bytes - used >= MIN_REQUEST_FRACTION * self._total_bytes
        return roomy and last_step is not None and self.samples - last_step <= RELIEF_READINGS

    def _others_read(self, relieved: float, reads: list[float]) -> float | None:
        """The others' bytes as the process's own count read them at each reading of a fall (the
        least of them), where it read them nearer where they were believed than where the count in
        flight puts them (`relieved`): then our requests hold less (slots admitted and not allocated
        yet, or smaller requests), not the others (a neighbour that filled the card exactly, read
        as gone at two readings that each caught an unallocated slot, and the limit rose into it).
        None where it did not read them at both, or its rest rose at the last idle reading (a
        request's tensors not freed yet, read into the others' bytes and the rest alike)."""
        baseline = self._baseline
        if self._own_rest_rose or baseline is None or len(reads) < RELIEF_READINGS:
            return None
        least = min(reads)
        return least if least > (baseline + relieved) / 2 else None

    def _size_read_lately(self, floor: float) -> bool:
        """Whether a reading within `SHRINK_SERVICES` service times before the last `RELIEF_READINGS`
        showed our requests (beside the others' `floor`) holding at least their mean less a spread each."""
        if self._service_s is None or self._per_request is None:
            return False  # none served yet: no time to look back over
        least = self._per_request - math.sqrt(self._spread_sq)
        lately = list(self._recent)[-(SHRINK_READINGS + RELIEF_READINGS) :]
        if len(lately) < RELIEF_READINGS:
            return False
        since_s = lately[-RELIEF_READINGS][0] - SHRINK_SERVICES * self._service_s
        return any(t >= since_s and n > 0 and used - floor >= least * n for t, n, used in lately[:-RELIEF_READINGS])

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
        """One reading of the mean bytes of `in_flight` requests: their mean moves up fast and down
        slowly (a reading below it is as often a request admitted and not yet allocated, or early in
        its forward pass, as a small one; what matters is what requests hold at their peak), and
        their spread is that of the readings above the mean since the sizes last changed."""
        if self._per_request is not None and share < HOLLOW_SHARE * self._per_request:
            # Requests in flight that hold next to nothing: admitted and not allocated yet, or failing
            # before they allocate (a 4xx from the route, a worker that went down). No size to learn
            # from one; `SETTLED_READINGS` in a row with no OOM between them are requests that hold
            # that little (a mix whose spread, learned from a few large ones, put every later
            # reading within its noise: the limit stayed at 5 where 64 fit).
            if share * in_flight < MIN_REQUEST_FRACTION * self._total_bytes:
                self._hollow.clear()  # nothing held at all: a stalled loop's, not small requests
                return
            self._hollow.append((share, in_flight))
            if len(self._hollow) >= SETTLED_READINGS:
                self._sizes_changed()
                most = max(s for s, _ in self._hollow)  # the most cautious of them
                self._per_request = max(MIN_REQUEST_FRACTION * self._total_bytes, most)
                self._shares.extend(self._hollow)
                self._spread_sq = 0.0  # none above the most cautious: the spread is learned anew
                self._hollow.clear()
            return
        self._hollow.clear()
        self._shares.append((share, in_flight))
        if self._per_request is None:
            self._per_request = share
        else:
            weight = SHARE_UP if share > self._per_request else SHARE_DOWN
            self._per_request += weight * (share - self._per_request)
        self._per_request = max(MIN_REQUEST_FRACTION * self._total_bytes, self._per_request)
        self._fit_shares()

    def _share_quantile(self) -> float | None:
        """`SIZE_QUANTILE` of what the readings since the sizes last changed showed one request holding."""
        if len(self._shares) < MIN_QUANTILE_READINGS:
            return None
        ranked = sorted(share for share, _ in self._shares)
        return ranked[int(SIZE_QUANTILE * len(ranked))]

    def _fit_shares(self) -> None:
        """The spread of one request's bytes, from the readings above the mean: a mean of n
        requests strays by spread / sqrt(n) from theirs, so n * deviation^2 is one sample of one
        request's variance."""
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
            # A rise the own count reads at the newest is the others', not a point of the line: a
            # neighbour that took under half a request of a full card at its first reading was
            # absorbed into it, and the requests admitted into the room it took next ran out. Nor
            # is a rise the next reading has yet to confirm (`_read_busy`): at that reading, a line
            # through its two high readings hid most of a neighbour in the others' bytes.
            return False
        mean_x = sum(x for x, _ in recent) / n
        mean_y = sum(y for _, y in recent) / n
        var_x = sum((x - mean_x) ** 2 for x, _ in recent) / n
        most_common = max(Counter(x for x, _ in recent).values())
        if var_x < 0.1 or most_common > 0.875 * n or n - most_common < 2:
            # In-flight barely varied: a few stray samples must not tilt the line, and one alone
            # (a neighbour's blip read at another level) would set its slope all by itself.
            return False
        slope = sum((x - mean_x) * (y - mean_y) for x, y in recent) / n / var_x
        if slope < MIN_REQUEST_FRACTION * self._total_bytes:
            return False
        intercept = mean_y - slope * mean_x
        if intercept < 0:
            return False
        if self._idle_floor is not None and intercept < self._idle_floor - 0.25 * slope:
            # The others below what the card held with nothing of ours in flight, ever (our own weights
            # are in it): the line is tilted by readings that caught requests admitted and not yet
            # allocated, which hold nothing (a 3 GiB request read as 3.26 beside 6.6 GiB of others,
            # where the card held 8 idle, left two of three that fit beside a neighbour).
            return False
        residual_sq = sum((y - intercept - slope * x) ** 2 for x, y in recent) / n
        newest_x, newest_y = recent[-1]
        if newest_y - intercept - slope * newest_x > max(0.5 * slope, 3 * math.sqrt(residual_sq)):
            # The newest reading holds more than the line says: the others rose (a neighbour came
            # between readings). Absorbed into a line over the readings from before, it tilted it
            # (3.6 GiB a request where 4 were) and hid the change; read against the model, it is the
            # others' rise, believed at once.
            return False
        # Through two neighbouring levels only, a line must be clean: through a mix's it points
        # anywhere at zero (8 GiB a request and nothing of the others', where 2.6 GiB and 8 GiB are).
        narrow = max(x for x, _ in recent) - min(x for x, _ in recent) < 2
        if residual_sq > ((0.05 if narrow else 0.25) * slope) ** 2:
            return False  # not one line: the window straddles a change (sizes, a neighbour); wait it out
        lowest_used = min(y for _, y in recent)
        self._baseline = min(lowest_used, intercept)
        self._per_request = slope
        self._spread_sq = residual_sq / max(1.0, mean_x)  # y strays by sqrt(n) times one request's spread
        return True

    def estimate(self) -> MemoryEstimate | None:
        if self._per_request is None or self._baseline is None:
            return None
        floor = self._size_floor
        per_request = self._per_request if floor is None else max(self._per_request, floor[0])
        spread = math.sqrt(self._spread_sq)
        if self._quantile is not None and spread < MIX_SPREAD * self._per_request:
            per_request = max(per_request, self._quantile)  # one size: readings before their peak are not it
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
        Not in a mix: there an OOM is its large ones meeting, which the tail planned for answers
        (`mix_oom`), and a level barred by the pile-ups met while learning it is one held blindly."""
        est = self.estimate()
        if est is None:
            return None
        room_bytes = self.target_utilisation * est.total_bytes - est.baseline_bytes
        # Slack (`FIT_SLACK`): a fit of exactly n, estimated a hair short, must not floor to n - 1.
        slack_bytes = FIT_SLACK * est.per_request_bytes
        n = max(0, math.floor((room_bytes + slack_bytes) / est.per_request_bytes))
        # The tail is planned for in a mix only: below `MIX_SPREAD` the spread is the readings' noise
        # (requests admitted and not yet allocated, a count taken a moment apart from the bytes),
        # and planning for it left two of three requests of one size that fit exactly.
        tail_bytes = self.z * est.spread_bytes if self.is_mix() else 0.0
        while n > 0 and n * est.per_request_bytes + tail_bytes * math.sqrt(n) > room_bytes + slack_bytes:
            n -= 1
        if now_s is None or self.is_mix():
            return n
        barred = self.ooms.barred_from(now_s, room_bytes / est.per_request_bytes)
        return n if barred is None else min(n, barred - 1)

    def failed(self, now_s: float) -> None:
        """A request ran out of memory at `now_s`: requests that hold nothing may be those failing, not
        small. The readings of the last service time counted it in flight while it held nothing (its
        allocation failed, and the error came later): they go from the line, which they tilted (three
        in flight read where two held the card put a request at 4.4 GiB where 5.4 are, and the limit
        went to three where two fit)."""
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

    def is_mix(self) -> bool:
        """Whether the requests' sizes vary (their spread is more than `MIX_SPREAD` of their mean):
        then an OOM is their large ones meeting, as often as the tail planned for allows (`mix_oom`),
        not a level that stopped fitting (`OomStates`)."""
        est = self.estimate()
        return est is not None and est.spread_bytes >= MIX_SPREAD * est.per_request_bytes

    def never_fits(self, nbytes: float) -> bool:
        """Whether an allocation of `nbytes` is more than the card has beside the others' bytes,
        with nothing of ours in flight: an OOM asking for it is the request's own, which no load
        could have avoided."""
        est = self.estimate()
        return est is not None and nbytes > est.total_bytes - est.baseline_bytes

    def learn_size(self, nbytes: float, units: float, now_s: float) -> bool:
        """An allocation of `nbytes` failed in a request of `units` at `now_s`. Where the requests
        were of one size since the card last changed and this is beyond it (three spreads above the
        mean), sizes changed (inputs grew): a request is believed to hold at least that much from
        now on, before any reading shows it (True), and until every request in flight arrived after
        it (`oldest_in_flight`). In a mix, a large one failing says nothing new about the sizes."""
        est = self.estimate()
        if est is None:
            return False
        per_unit = nbytes / max(units, 1e-9)
        # Since the sizes last changed, not the card: inputs that grow are first read as the others'
        # rise, a change of the card, and the OOM that follows names the new size (guarded so, it
        # was not believed, and three more levels ran out in real time). Soon after they shrank, a
        # size well beyond the one from before (more than a mix's spread) is no request left from
        # before either: the requests that grew and failed hold nothing, read as sizes that shrank,
        # and 65 OOMs followed.
        before = self._size_before
        settled = self._since_sizes >= SETTLED_READINGS or (before is not None and per_unit > (1 + MIX_SPREAD) * before)
        uniform = settled and est.spread_bytes < MIX_SPREAD * est.per_request_bytes
        if uniform and per_unit > est.per_request_bytes + 3 * est.spread_bytes:
            self._per_request = per_unit
            self._size_floor = (per_unit, now_s)
            self._sizes_changed()  # readings from before were of smaller requests
            return True
        return False

    def oldest_in_flight(self, arrived_s: float | None) -> None:
        """When the oldest request in flight arrived (None: none that could be from before), before a
        reading. Requests that arrived before an OOM named a larger size may be of the sizes from
        before (waiting in the line when inputs grew): readings of them would bring the size back
        down, the limit up, and the next requests of the new size to another OOM. So the size named
        holds until every request in flight arrived after it; from then on the readings describe the
        new sizes."""
        self._oldest_s = arrived_s
        floor = self._size_floor
        if floor is not None and (arrived_s is None or arrived_s >= floor[1]):
            self._size_floor = None
            if self._per_request is not None:
                self._per_request = max(self._per_request, floor[0])

    def heavier_before(self) -> tuple[float, float] | None:
        """Where the sizes shrank and had been settled before: when the oldest request read at the
        new size arrived, and how many of the new sizes one from before holds (at least 1). A request
        that arrived before then may be one of those; the gate weighs it so while it waits."""
        shrunk, per_request = self._shrunk, self._per_request
        if shrunk is None or per_request is None or self.is_mix():
            return None  # in a mix, the large ones are the tail the cap plans for, not ones from before
        return shrunk[0], max(1.0, shrunk[1] / per_request)

    def explained_by_size(self, level: float, nbytes: float, units: float = 1) -> bool:
        """Whether `level` units in flight, one request of `units` among them asking for `nbytes`,
        overflow the room only because of that request's size: the others at the model's size and
        it at its own do not fit, the model's `level` would. Then the OOM says nothing of how many
        of the model's requests fit (a large one from before the sizes shrank, still in the line).
        A size within a mix's spread of the model's (`MIX_SPREAD`) explains nothing: it says the model
        is short (readings that caught requests not yet allocated), and its level is barred as any
        OOM's, not for the seconds a stray's is, after which five that did not fit were tried again
        and again (0.76 of the reader where requests allocate up to half their work late)."""
        est = self.estimate()
        if est is None or nbytes <= (1 + MIX_SPREAD) * units * est.per_request_bytes:
            return False
        room_bytes = self.target_utilisation * est.total_bytes - est.baseline_bytes
        return (level - units) * est.per_request_bytes + nbytes > room_bytes >= level * est.per_request_bytes
