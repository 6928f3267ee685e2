"""What OOMs showed of the card: so many in flight did not fit in so much room.

The memory model's correction (`memory_model.MemoryModel.ooms`): a level that ran out stays barred
while the card reads no roomier than it did then, and comes back the moment the readings say the
card changed. Arithmetic on observations, the time passed in.
"""

from __future__ import annotations

import math

__all__ = ["FIT_SLACK", "ROOM_MARGIN", "OomStates"]

# Room within this share of a request of a level is room for it: at an exact fit, estimates a few MiB
# apart read as room for 2.999.
FIT_SLACK = 0.01
# How much roomier (in requests) the card must read than at an OOM before its level is tried again:
# less let two gates on one card, each the other's neighbour, run out by turns.
ROOM_MARGIN = 1.0
# How long after an OOM the readings still describe the card it happened on (and the first after it): a
# greedy neighbour's first bytes, beside requests caught before they allocate, read as ours growing, and
# its rise as the others' only at the fourth reading.
OOM_STATE_S = 0.5
MAX_STATES = 16
PLACED_MEMORY_S = 120.0  # an OOM the gate saw, kept this long at most (a card that never changes)
# One the app caught (cuDNN counts its own tries too), or one its own request's size explains.
WEAK_MEMORY_S = 3.0


class OomStates:
    """What OOMs showed: so many in flight did not fit in so much room (in requests).

    Each bars its level and above while the card reads no roomier than then (within `ROOM_MARGIN`
    of a request). The room is the tightest read within `OOM_STATE_S` after it, and at the first
    reading after it in any case: the reading that shows a neighbour's arrival may come after the
    OOM it caused. An OOM the gate did not see itself (`placed=False`) is forgotten sooner; none is
    kept past `PLACED_MEMORY_S`: a misread one costs one OOM every two minutes, not the level for good.
    """

    def __init__(self) -> None:
        # [level, room then, when, until, load, 1 until a reading came, a request's bytes then (0: not known)]
        self._states: list[list[float]] = []
        self._request_bytes = 0.0  # a request's bytes as the model held them at the last reading

    def record(
        self, now_s: float, level: int, room: float | None, *, placed: bool = True, load: float | None = None
    ) -> None:
        """`level`: the whole slots barred from; `load`: the slots in flight that did not fit, where
        requests weigh parts of one (route weights, `cost`): 6.75 ran out, where 7 is the level."""
        memory_s = PLACED_MEMORY_S if placed else WEAK_MEMORY_S
        kept = [state for state in self._states if now_s < state[3]]
        room_then, load_then = math.inf if room is None else room, level if load is None else load
        state = [level, room_then, now_s, now_s + memory_s, load_then, 1, self._request_bytes]
        self._states = [*kept[-(MAX_STATES - 1) :], state]

    def observe(self, now_s: float, room: float | None, request_bytes: float = 0.0) -> None:
        """A reading: the room it showed (in requests of `request_bytes` each, the model's size)."""
        if room is None:
            return
        self._request_bytes = request_bytes
        for state in self._states:
            if state[5] or now_s - state[2] <= OOM_STATE_S:
                if room < state[1]:
                    state[1], state[6] = room, request_bytes
                state[5] = 0

    def barred_from(self, now_s: float, room: float) -> int | None:
        """The lowest level barred with `room` for so many requests now, or None."""
        barred = [int(state[0]) for state in self._states if self._bars(state, now_s, room)]
        return min(barred) if barred else None

    def barred_load(self, now_s: float, room: float) -> float | None:
        """The fewest slots in flight that ran out among the bars that hold with `room` now, or None:
        requests that weigh parts of a slot may fill up to under it."""
        loads = [state[4] for state in self._states if self._bars(state, now_s, room)]
        return min(loads) if loads else None

    def describe(self, now_s: float, room: float | None) -> dict[str, float] | None:
        """The bar that holds the limit now, for the status: its level, the room then, its age."""
        if room is None:
            return None
        lowest = self.barred_from(now_s, room)
        for state in self._states:
            level, room_then, at_s = state[:3]
            if level == lowest and self._bars(state, now_s, room):
                return {"level": int(level), "room_then": round(room_then, 2), "age_s": round(now_s - at_s, 2)}
        return None

    def forget(self) -> None:
        """Slots changed what they weigh: the levels barred so far are in the old ones."""
        self._states.clear()

    @staticmethod
    def ran_out(state: list[float]) -> float:
        """The slots that ran out: the load where requests weigh parts of one (4.3 of level 5), else the
        level (an OOM with one in flight bars two, where the least limit is one)."""
        level, load = state[0], state[4]
        return load if load > level - 1 else level

    def _bars(self, state: list[float], now_s: float, room: float) -> bool:
        """Whether an OOM's state still bars its level with `room` for so many requests now, by the
        slots that ran out (`ran_out`):
        * the readings after it explained it (room then under them: a neighbour came): until the model
          says they fit again;
        * they fitted by the slack alone (room for 20.99 taken for 21): until they fit without it;
        * the model said it fitted outright: until the card reads `ROOM_MARGIN` roomier than then.
        The room then is counted in requests of the size believed now, where that is larger."""
        room_then, until_s = state[1], state[3]
        if now_s >= until_s:
            return False
        if 0 < state[6] < self._request_bytes:
            room_then *= state[6] / self._request_bytes
        need = self.ran_out(state)
        if room_then + FIT_SLACK < need:  # the model did not take it for a fit then (`FIT_SLACK`)
            return room + FIT_SLACK < need
        if room_then < need:  # a fit by the slack alone: the model was right, its slack was not
            return room < need + FIT_SLACK
        return room + FIT_SLACK < room_then + ROOM_MARGIN
