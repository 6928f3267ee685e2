"""The gate's own answers: `503`/`429` with `Retry-After` for capacity, `413`/`408` for bodies
that are the client's doing, and the log line an OOM deserves (one per congestion event).

Kept apart from the middleware so the way of a request there reads without the wording of its
refusals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

from .._gate.core import GateCore, Ticket
from .._gate.reasons import Reason
from ..options import GateOptions
from .body import Body, BodyBudget, ReadOutcome, read_body
from .endpoints import send_json

__all__ = ["CLOSE", "Answers"]

logger = logging.getLogger("adaptive_gate")

CLOSE = [(b"connection", b"close")]


class Answers:
    def __init__(self, core: GateCore, options: GateOptions, clock: Callable[[], float]) -> None:
        self.core = core
        self._clock = clock
        self.options = options
        self._oom_logged_epoch = -1

    async def reject(
        self,
        send: Send,
        reason: Reason,
        detail: str,
        *,
        timed_out: bool = False,
        request_class: tuple[int, str | None] | None = None,
    ) -> None:
        # Without a class: no classes configured, or an answer outside admission (a full body
        # buffer, an OOM): not counted per class.
        priority, tenant = (None, None) if request_class is None else request_class
        retry_after_s = self.core.rejected(
            reason, now_s=self._clock(), timed_out=timed_out, priority=priority, tenant=tenant
        )
        body = {"detail": detail, "reason": reason, "retry_after_s": retry_after_s}
        headers = [(b"retry-after", str(retry_after_s).encode())]
        await send_json(send, self.options.reject_status, body, headers=headers)

    async def refuse_body(self, send: Send, outcome: ReadOutcome) -> None:
        """413 or 408: the client's own doing, no capacity answer (no Retry-After, not `rejected`)."""
        too_large = outcome is ReadOutcome.TOO_LARGE
        self.core.body_refused(too_large=too_large)
        if too_large:
            detail = f"the request body is over max_body_bytes ({self.options.max_body_bytes} bytes)"
            await send_json(send, 413, {"detail": detail, "reason": "body_too_large"}, headers=CLOSE)
        else:
            detail = "the request body did not arrive within the body timeout (or the request's deadline)"
            await send_json(send, 408, {"detail": detail, "reason": "body_timeout"}, headers=CLOSE)

    async def answer_oom(self, send: Send, *, alone: bool) -> None:
        if alone:
            detail = "this request ran out of GPU memory while it ran alone: it is too large for the card as the card is now; send a smaller input"  # noqa: E501
            await self.reject(send, Reason.TOO_LARGE, detail)
        else:
            await self.reject(send, Reason.OOM, Reason.OOM.detail)

    def log_oom(self, ticket: Ticket, scope: Scope, *, alone: bool) -> None:
        # One line per congestion event, not per request: a burst of OOMs is one story.
        level = logging.WARNING if ticket.epoch > self._oom_logged_epoch or alone else logging.DEBUG
        self._oom_logged_epoch = max(self._oom_logged_epoch, ticket.epoch)
        limiter = self.core.limiter
        logger.log(
            level,
            "adaptive_gate: out of memory in %s %s with %g in flight, answered %d; limit now %d%s",
            scope["method"],
            scope["path"],
            limiter.in_flight + ticket.units,
            self.options.reject_status,
            limiter.limit,
            " (it ran alone: too large for the card, the limit is not cut for it)" if alone else "",
        )

    async def read_body(
        self, receive: Receive, send: Send, deadline_s: float, length: int | None, budget: BodyBudget
    ) -> Body | None:
        """A gated request's whole body, before it may take a slot; None when it was answered here
        instead (too large, too slow, the buffer full) or its client left."""
        options = self.options
        if length is not None and length > options.max_body_bytes:  # -1: unreadable, found out by reading
            await self.refuse_body(send, ReadOutcome.TOO_LARGE)
            return None
        # Never past the request's own deadline: an answer after it is one nobody waits for (the timer starts
        # with the body's second message, so a body that comes whole is read whatever the deadline). A deadline
        # of 0 (`queue_timeout=0`) is no time to wait for a slot: the body has `body_timeout`.
        timeout_s = min(options.body_timeout, deadline_s) if deadline_s > 0 else options.body_timeout
        body = await read_body(receive, max_body_bytes=options.max_body_bytes, budget=budget, timeout_s=timeout_s)
        if body.outcome is ReadOutcome.COMPLETE:
            return body
        if body.outcome is ReadOutcome.DISCONNECTED:
            self.core.left()
        elif body.outcome is ReadOutcome.BUFFER_FULL:
            await self.reject(send, Reason.QUEUE_FULL, "the request bodies waiting for the GPU fill the gate's buffer")
        else:
            await self.refuse_body(send, body.outcome)
        return None
