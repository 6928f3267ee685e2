"""`BEHIND_A_GATE`: what code running under a gated request may tell the gate in front of it.

The gate sets it around each gated request; a batcher that runs there (`adaptive_gate.batch`)
reports itself at each call, and the gate, where its limit is not that batcher's, says once that the
two hold two views of the card (`batcher_without_its_controller`). A context variable, not an argument:
the batcher is called from the user's route, which knows nothing of the gate.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["BEHIND_A_GATE", "BATCHERS"]

BEHIND_A_GATE: ContextVar[Callable[[object], None] | None] = ContextVar("adaptive_gate_behind_a_gate", default=None)


class _Batchers:
    """Whether any batcher was made in this process: until one is, a gated request sets nothing
    (a context variable set and reset costs about half a microsecond a request)."""

    made = False


BATCHERS = _Batchers()
