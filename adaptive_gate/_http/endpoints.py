"""The gate's own endpoints: status, metrics, dashboard, readiness, and the limits an operator sets.

Each can be moved or switched off (`None`). With an `admin_token`, status, metrics and dashboard
answer 401 without `Authorization: Bearer <token>` (compared in constant time), unless listed in
`unprotected`; `PUT {limits_path}` exists only then. Readiness is never protected: Kubernetes
probes carry no token, and it tells nothing but ready or not and why.

A browser cannot add a header to a page it navigates to, so the dashboard answers its 401 with a
small page that asks for the token, keeps it in the tab's `sessionStorage` and sends it as a
header; the token never travels in a URL, where access logs would keep it.
"""

from __future__ import annotations

import functools
import hmac
import json
from importlib import resources
from typing import Any, Protocol

from starlette.types import Receive, Scope, Send

from .._gate.operator import LimitsError
from .._observe.status import render_json
from ..options import PATH_OPTIONS, GateOptions

__all__ = ["Endpoints", "GateControl", "LimitsError", "send_bytes", "send_json"]

MAX_LIMITS_BODY_BYTES = 16 << 10


class GateControl(Protocol):
    def status(self) -> dict[str, Any]: ...

    def metrics_body(self) -> bytes | None: ...

    def dashboard_data(self) -> dict[str, Any]: ...

    def readiness(self) -> tuple[bool, list[str]]: ...

    def degraded(self) -> list[str]: ...

    def operator_limits(self) -> dict[str, Any]: ...

    def set_operator_limits(self, body: object) -> dict[str, Any]: ...


async def send_bytes(
    send: Send,
    status: int,
    body: bytes,
    *,
    content_type: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
    head: bool = False,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else body})


async def send_json(
    send: Send,
    status: int,
    document: dict[str, Any],
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    head: bool = False,
) -> None:
    await send_bytes(send, status, render_json(document), content_type=b"application/json", headers=headers, head=head)


@functools.cache
def _page(name: str) -> bytes:
    return resources.files("adaptive_gate._http").joinpath(name).read_bytes()


class Endpoints:
    """Which path is which endpoint, and who may read it: from the gate's checked options."""

    def __init__(self, options: GateOptions) -> None:
        self._token = None if options.admin_token is None else options.admin_token.encode()
        self._protected = options.protected
        paths = {name.removesuffix("_path"): getattr(options, name) for name in PATH_OPTIONS}
        self._by_path = {path: name for name, path in paths.items() if path is not None}
        if options.admin_token is None:
            self._by_path = {path: name for path, name in self._by_path.items() if name != "limits"}
        dashboard = paths["dashboard"]
        if dashboard is not None:
            self._by_path[dashboard + "/data"] = "dashboard_data"

    @property
    def by_path(self) -> dict[str, str]:
        """path -> the name of the endpoint served there."""
        return self._by_path

    def _authorised(self, scope: Scope) -> bool | None:
        """True with the right token, False with a wrong one, None with none at all."""
        assert self._token is not None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                if scheme.lower() != b"bearer":
                    return False
                return hmac.compare_digest(credentials.strip(), self._token)
        return None

    async def handle(self, name: str, gate: GateControl, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        allowed = ("GET", "HEAD", "PUT") if name == "limits" else ("GET", "HEAD")
        if method not in allowed:
            await send_json(
                send,
                405,
                {"detail": f"{method} is not allowed here; use {', '.join(allowed)}"},
                headers=[(b"allow", ", ".join(allowed).encode())],
            )
            return
        head = method == "HEAD"
        guard = "dashboard" if name == "dashboard_data" else name
        if guard in self._protected or guard == "limits":
            authorised = self._authorised(scope)
            if not authorised:
                await self._unauthorised(send, html=name == "dashboard", wrong=authorised is False, head=head)
                return
        if name == "status":
            await send_json(send, 200, gate.status(), head=head)
        elif name == "metrics":
            await self._metrics(gate, send, head)
        elif name == "dashboard":
            await send_bytes(send, 200, _page("dashboard.html"), content_type=b"text/html; charset=utf-8", head=head)
        elif name == "dashboard_data":
            await send_json(send, 200, gate.dashboard_data(), head=head)
        elif name == "ready":
            ready, reasons = gate.readiness()
            document = {"ready": ready, "reasons": reasons, "degraded": gate.degraded()}
            await send_json(send, 200 if ready else 503, document, head=head)
        elif method == "PUT":
            await self._put_limits(gate, receive, send)
        else:
            await send_json(send, 200, gate.operator_limits(), head=head)

    @staticmethod
    async def _metrics(gate: GateControl, send: Send, head: bool) -> None:
        body = gate.metrics_body()
        if body is None:
            from .._observe.metrics import MISSING

            await send_json(send, 404, {"detail": MISSING}, head=head)
            return
        from .._observe.metrics import CONTENT_TYPE

        await send_bytes(send, 200, body, content_type=CONTENT_TYPE.encode(), head=head)

    async def _unauthorised(self, send: Send, *, html: bool, wrong: bool, head: bool) -> None:
        challenge = b'Bearer realm="adaptive-gate"' + (b', error="invalid_token"' if wrong else b"")
        headers = [(b"www-authenticate", challenge)]
        if html:
            body = _page("login.html")
            await send_bytes(send, 401, body, content_type=b"text/html; charset=utf-8", headers=headers, head=head)
            return
        detail = "the token is wrong" if wrong else "this endpoint needs the header Authorization: Bearer <admin_token>"
        await send_json(send, 401, {"detail": detail}, headers=headers, head=head)

    async def _put_limits(self, gate: GateControl, receive: Receive, send: Send) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > MAX_LIMITS_BODY_BYTES:
                await send_json(send, 413, {"detail": f"the body is over {MAX_LIMITS_BODY_BYTES} bytes"})
                return
            if not message.get("more_body", False):
                break
        try:
            document = json.loads(body)
        except ValueError as exc:
            await send_json(send, 422, {"detail": f"the body is not JSON: {exc}"})
            return
        except RecursionError:  # nested thousands deep: no limits document looks like that
            await send_json(send, 422, {"detail": "the body is JSON nested too deep; send a flat object"})
            return
        try:
            answer = gate.set_operator_limits(document)
        except LimitsError as exc:
            await send_json(send, 422, {"detail": str(exc)})
            return
        await send_json(send, 200, answer)
