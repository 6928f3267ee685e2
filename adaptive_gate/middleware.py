"""`AdaptiveGate`: admission control in front of the routes that use the GPU.

This module is the ASGI glue and nothing else: which requests are gated, reading a gated request's
body, waiting for a slot, holding the slot around the application, answering `503` (or `429`)
with a `Retry-After`, and the operating endpoints. What the gate decides and counts lives in
`GateCore` (`_gate/core.py`), which the simulator drives too; the background loops in `_http/background.py`.

Gated requests take a slot before they reach the application and hold it until the last byte of
their response is sent. Requests that find no free slot wait in line (FIFO, or by priority and
tenant when configured, newest first while the queue stands) only as long as they can still finish
before their deadline; while they wait the gate listens on `receive()`, so a client that leaves
gives up its place at once.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import fields
from typing import Any, Unpack

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._control.control import AIMD
from ._gate.core import GateCore, Outcome, Ticket, units_of_cost
from ._gate.limiter import Waiter
from ._gate.reasons import ADMITTED, Reason, Waited
from ._gate.statistics import GateStatistics
from ._http.answers import Answers
from ._http.background import serve_lifespan
from ._http.body import Body, BodyBudget, ReadOutcome, request_head
from ._http.classify import Classifier
from ._http.endpoints import Endpoints
from ._http.keywords import GateKeywords, signature_of_options
from ._http.line import wait_in_line
from ._http.operations import Operations
from ._http.routes import RouteTable
from ._observe.diagnostics import Diagnostics
from ._observe.gated import BATCHERS, BEHIND_A_GATE
from ._observe.metrics import GateMetrics
from ._observe.watch import GatedRoute
from .oom import any_in_chain, is_oom, tried_bytes
from .options import GateOptions, gate_options

__all__ = ["AdaptiveGate", "ClientNotReading", "GateKeywords"]

logger = logging.getLogger("adaptive_gate")

ABANDONED = "the client read nothing for send_timeout; the response was abandoned"


class ClientNotReading(Exception):
    """A send to the client did not complete within `send_timeout`: the response is abandoned."""


class AdaptiveGate:
    """Pure ASGI middleware: `app.add_middleware(AdaptiveGate, **options)`.

    The options, their defaults and what each accepts are declared once, in `GateOptions`
    (`adaptive_gate.options`); the signature below is made from them. `controller`, `diagnostics`
    and `clock` are collaborators, not settings: each gate needs its own.
    """

    def __init__(self, app: ASGIApp, **options: Unpack[GateKeywords]) -> None:
        self.app = app
        self.options = gate_options(dict(options))
        controller, diagnostics, clock = self.options.controller, self.options.diagnostics, self.options.clock
        self.core = GateCore(
            AIMD() if controller is None else controller,
            min_limit=self.options.min_limit,
            max_limit=self.options.max_limit,
            initial_limit=self.options.initial_limit,
            max_queue=self.options.max_queue,
            max_retry_after_s=self.options.max_retry_after,
            unix_offset_s=time.time() - clock(),
            classes=self.options.priority is not None or self.options.tenant is not None,
            priority_aging_s=self.options.priority_aging,
            overload=self.options.overload,
            queue_target_s=self.options.queue_target,
        )
        classifier = Classifier(self.options.priority, self.options.tenant)
        self._classify = classifier.classify if classifier.enabled else None
        self._clock = clock
        self._cost, self._queue_timeout_s = self.options.cost, self.options.queue_timeout
        self.ops = Operations(
            self.options, self.core, diagnostics if diagnostics is not None else Diagnostics(), clock=clock
        )
        self._endpoints = Endpoints(self.options)
        self._answers = Answers(self.core, self.options, clock)
        self._routes = RouteTable(
            self.options.tag,
            fallback_app=app,
            endpoints=self._endpoints.by_path,
            health_paths=self.options.health_paths,
        )
        self.ops.tick_hooks.append(self._routes.notice_changes)
        self._batcher_behind = self.ops.batcher_behind  # what a batcher under a gated request reports to
        self._body_budget = BodyBudget(self.options.max_buffered_bytes)

    # -- ASGI -----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope_type = scope["type"]
        if scope_type != "http":
            if scope_type == "lifespan":
                self.ops.read_thread_pool()
                await serve_lifespan(self.app, self.ops.background, scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        decision = self._routes.decide(scope)
        if decision is None:
            await self.app(scope, receive, send)
        elif decision.__class__ is GatedRoute:
            background = self.ops.background
            if not background.ready:
                self.ops.read_thread_pool()
                await background.start_without_lifespan()
            await self._gated(decision, scope, receive, send)
        else:
            await self._endpoints.handle(decision, self.ops, scope, receive, send)  # type: ignore[arg-type]

    async def _gated(self, route: GatedRoute, scope: Scope, receive: Receive, send: Send) -> None:
        # One coroutine for the whole of a request's way through the gate (its body read first,
        # then a slot, then the app in the slot): every request takes this path, and each frame
        # of its own would cost. The slow ways (a queue, a rejection) are helpers.
        clock, core = self._clock, self.core
        arrived_s = clock()
        cost = self._cost
        requests = 1 if cost is None else core.shaped(units_of_cost(cost(scope)))  # before its route's weight
        units = core.weigh(route, requests)
        proxy_s, length, has_body = request_head(scope)
        deadline_s = self._queue_timeout_s  # from its arrival, the body included
        body: Body | None = None
        now_s = arrived_s  # no body to read: it may go in the moment it arrived, and waited for nothing
        if has_body:
            body = await self._answers.read_body(receive, send, deadline_s, length, self._body_budget)
            if body is None:
                return
            receive = body.receive
            now_s = clock()
            if 0 < deadline_s <= now_s - arrived_s:  # a body held back whole past the deadline: nobody waits now
                self._body_budget.give_back(body.nbytes)
                await self._answers.refuse_body(send, ReadOutcome.TIMED_OUT)
                return
            deadline_s -= now_s - arrived_s  # the time reading the body took counts
        if proxy_s is not None and proxy_s < deadline_s:
            deadline_s = proxy_s  # the proxy's deadline runs from the end of the body, as Envoy's timer does
        ticket = core.enter(deadline_s, units, route, arrived_s, now_s, requests) if self._classify is None else None
        if ticket is None:  # no slot free at once, a deadline to judge, or classes: the long way
            admitted = await self._admit(route, scope, receive, send, body, deadline_s, (units, requests), arrived_s)
            if admitted is None:
                return
            ticket, receive = admitted
        elif body is not None:
            self._body_budget.give_back(body.nbytes)
        watch = self.ops.watch
        watch.running[ticket] = route  # what the monitor watches (stalls, stuck sends) while it runs
        informative = True  # a 4xx/5xx answer says nothing about capacity: no latency sample
        response_started = False

        async def send_and_release(message: Message) -> None:
            nonlocal informative, response_started
            if ticket.abandoned:
                raise ClientNotReading(ABANDONED)
            message_type = message["type"]
            if message_type == "http.response.start":
                response_started = True
                informative = message["status"] < 400
            ticket.sending_since_s = clock()  # the monitor's watchdog abandons a send stuck too long
            try:
                await send(message)
            finally:  # a send that raised is not one that waits
                ticket.sending_since_s = None
            last = (message_type == "http.response.body" and not message.get("more_body", False)) or (
                message_type == "http.response.pathsend"
            )
            if last:  # delivered whole, even if the watchdog gave up on it in the same instant
                if not ticket.released:
                    core.release(ticket, clock(), Outcome.COMPLETED if informative else Outcome.FAILED)
            elif ticket.abandoned:
                raise ClientNotReading(ABANDONED)

        behind = BEHIND_A_GATE.set(self._batcher_behind) if BATCHERS.made else None
        try:
            await self.app(scope, receive, send_and_release)
        except Exception as exc:
            if any_in_chain(exc, _not_reading):
                logger.info("adaptive_gate: %s %s: %s", scope["method"], scope["path"], ABANDONED)
                return  # the response is cut short: the server closes the connection
            if not is_oom(exc):
                core.failed()
                raise
            alone = self._out_of_memory(ticket, scope, tried_bytes(exc))
            if response_started:
                raise  # mid-stream: the status line is gone, the server must close the connection
            await self._answers.answer_oom(send, alone=alone)
        finally:
            if behind is not None:
                BEHIND_A_GATE.reset(behind)
            watch.ended(ticket, clock)
            if not ticket.released:  # an exception, a cancellation, a response never finished
                core.release(ticket, clock(), Outcome.FAILED)

    async def _admit(
        self,
        route: GatedRoute,
        scope: Scope,
        receive: Receive,
        send: Send,
        body: Body | None,
        deadline_s: float,
        weighed: tuple[float, float],
        arrived_s: float,
    ) -> tuple[Ticket, Receive] | None:
        """`arrive`, then a place in line or an answer: the ticket and the `receive` the app must
        use, or None when the request was answered (or its client left). `weighed`: its slots, and
        what it weighs before its route's weight (`GateCore.admitted`)."""
        units, requests = weighed
        heavier = 0.0  # what a waiter weighs beyond `units`, as one from before the sizes shrank
        core, classify = self.core, self._classify
        request_class: tuple[int, str | None] | None = None  # None: no priority or tenant configured
        if classify is None:
            admission = core.arrive(deadline_s, now_s=self._clock(), units=units, route=route)
        else:
            request_class = classify(scope)
            admission = core.arrive(
                deadline_s,
                now_s=self._clock(),
                units=units,
                route=route,
                priority=request_class[0],
                tenant=request_class[1],
            )
        if admission is not ADMITTED:
            replay = await self._wait_or_reject(admission, body, receive, send, request_class)
            if replay is None:
                return None
            receive = replay
            assert isinstance(admission, Waiter)  # a reason is answered: no replay
            units, heavier = core.granted(admission)
        elif body is not None:
            self._body_budget.give_back(body.nbytes)
        now_s = self._clock()
        ticket = core.admitted(now_s, now_s - arrived_s, units, route, requests, heavier)
        return ticket, receive

    async def _wait_or_reject(
        self,
        admission: Reason | Waiter,
        body: Body | None,
        receive: Receive,
        send: Send,
        request_class: tuple[int, str | None] | None,
    ) -> Receive | None:
        """No slot now: wait in line for one (the `receive` the app must use then), or answer."""
        if body is None:  # waiting means listening for a disconnect: what is read meanwhile is replayed
            body = Body(receive)
        try:
            return body.receive if await self._wait_for_slot(admission, body, send, request_class) else None
        finally:  # admitted or gone: the queue no longer holds these bytes
            self._body_budget.give_back(body.nbytes)

    def _out_of_memory(self, ticket: Ticket, scope: Scope, tried: int | None) -> bool:
        """The core hears of the OOM (and the allocation it names), the log says it once per event;
        True when the request is too large (alone, or asking for more than the card holds)."""
        now_s = self._clock()
        alone = self.core.oom(ticket, now_s, tried)
        self.core.release(ticket, now_s, Outcome.OOM)
        self._answers.log_oom(ticket, scope, alone=alone)
        return alone

    async def _wait_for_slot(
        self, admission: Reason | Waiter, body: Body, send: Send, request_class: tuple[int, str | None] | None
    ) -> bool:
        """Wait for the slot a place in line brings, or answer a rejection. True when admitted."""
        if isinstance(admission, Reason):
            await self._answers.reject(send, admission, admission.detail, request_class=request_class)
            return False
        # It waits only as long as it could still finish in time: its deadline less its work.
        clock = self._clock
        outcome = await wait_in_line(self.core, admission, body, self.core.wait_budget_s(admission, clock()), clock)
        if outcome is Waited.LEFT:
            self.core.left(*(request_class or ()))
        elif outcome is Reason.EVICTED:
            await self._answers.reject(send, outcome, outcome.detail, request_class=request_class)
        elif outcome is not Waited.GRANTED:
            detail = "no GPU slot became free in time for the request to finish before its deadline"
            await self._answers.reject(send, Reason.DEADLINE, detail, timed_out=True, request_class=request_class)
        return outcome is Waited.GRANTED

    # -- what tests and embedders read -------------------------------------------------------------

    @property
    def metrics(self) -> GateMetrics | None:
        """This gate's Prometheus registry (`.registry`), or None without prometheus-client."""
        return self.ops.metrics

    def statistics(self) -> GateStatistics:
        """A snapshot of everything the gate knows; reading it changes nothing."""
        return self.ops.statistics()

    def status(self) -> dict[str, Any]:
        """The document served at `status_path`."""
        return self.ops.status()

    # -- the background work's life -------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the gate's background work (probe readings, the monitor) for the block, having taken
        the first reading: for embedders that run the app without an ASGI lifespan."""
        self.ops.read_thread_pool()
        async with self.ops.background.running():
            yield

    async def aclose(self) -> None:
        """Stop the background work started without a lifespan; nothing is left running."""
        await self.ops.background.aclose()


def _not_reading(exc: BaseException) -> bool:
    return isinstance(exc, ClientNotReading)


# What `help(AdaptiveGate)`, `inspect.signature` and editors show: the keywords of `GateOptions`.
AdaptiveGate.__init__.__signature__ = signature_of_options(  # type: ignore[attr-defined]
    [
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("app", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="ASGIApp"),
    ],
    fields(GateOptions),
)
