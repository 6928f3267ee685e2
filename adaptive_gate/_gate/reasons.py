"""What admission answers, as enums: a request is admitted, waits, or is turned away for a reason.

The reasons are strings too (`StrEnum`): they are what a client reads in the answer's JSON body,
what the status counts in `rejected_by_reason`, and the metrics' `reason` label, unchanged.
"""

from __future__ import annotations

from enum import Enum, StrEnum

__all__ = ["ADMITTED", "Admitted", "Reason", "Waited"]


class Reason(StrEnum):
    """Why a gated request was turned away with `503` (or `429`) and a `Retry-After`."""

    QUEUE_FULL = "queue_full"
    DEADLINE = "deadline"
    OVERLOAD = "overload"
    EVICTED = "evicted"
    OOM = "oom"
    TOO_LARGE = "too_large"

    @property
    def detail(self) -> str:
        """The sentence the answer's body carries beside the reason."""
        return _DETAILS[self]


_DETAILS = {
    Reason.QUEUE_FULL: "too many requests are waiting for the GPU",
    Reason.DEADLINE: "the request is not expected to finish (its wait and its work) before its deadline",
    Reason.OVERLOAD: "more requests arrive than the GPU serves: new ones that would wait long are shed",
    Reason.EVICTED: (
        "the queue was full: a more important request, or one of a client with fewer waiting, took this one's place"
    ),
    Reason.OOM: "the GPU ran out of memory for this request; retry later",
    Reason.TOO_LARGE: "the request does not fit on the GPU even alone",
}


class Admitted(Enum):
    """A request that may run now: it holds its slots."""

    ADMITTED = "admitted"


ADMITTED = Admitted.ADMITTED


class Waited(Enum):
    """What waiting in line came to, besides a `Reason` the line gave up on it for."""

    GRANTED = "granted"  # its slots are handed over
    TIMEOUT = "timeout"  # its latest start passed
    LEFT = "left"  # the client went away
