"""The admission policies the benchmarks compare, applied to the same app.

* `adaptive`: `AdaptiveGate`, as a user adds it.
* `static:N`: the recipe users copy today: an `asyncio.Semaphore(N)` around inference and a thread
  pool of N workers, with CUDA OOM turned into a bare 503 (no Retry-After), and no queue bound.
* `none`: the route called directly; an OOM is a 500.
"""

from __future__ import annotations

import asyncio

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adaptive_gate import is_oom

GATED_PATHS = frozenset({"/predict", "/predict/batch"})


def parse_policy(text: str) -> tuple[str, int | None]:
    if text in ("adaptive", "none"):
        return text, None
    name, _, number = text.partition(":")
    if name == "static" and number.isdigit() and int(number) >= 1:
        return "static", int(number)
    raise ValueError(f"--policy must be 'adaptive', 'none' or 'static:N' with N >= 1, got {text!r}")


class SemaphoreMiddleware:
    """`async with semaphore:` around the inference routes, as in the hand-tuned recipe."""

    def __init__(self, app: ASGIApp, *, limit: int, paths: frozenset[str] | set[str] = GATED_PATHS) -> None:
        self.app = app
        self.limit = limit
        self.paths = frozenset(paths)
        self.waiting = 0
        self._semaphore: asyncio.Semaphore | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.limit)
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        try:
            try:
                await self.app(scope, receive, send_tracking)
            except Exception as exc:
                if not is_oom(exc) or started:
                    raise
                failure = True
            else:
                failure = False
        finally:
            self._semaphore.release()
        if failure:
            await JSONResponse({"detail": "GPU memory exhausted, please retry later"}, 503)(scope, receive, send)
