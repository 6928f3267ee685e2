"""Raw ASGI calls, for what no client can express: a client that leaves, a body that trickles in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

Message = dict[str, Any]


def http_scope(path: str, method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers or [(b"host", b"test")],
        "client": ("127.0.0.1", 12345),
        "server": ("127.0.0.1", 80),
        "state": {},
    }


class RawClient:
    """One request: the body arrives in `chunks`; after them the client waits for `disconnect`."""

    def __init__(self, chunks: list[bytes] | None = None) -> None:
        self.chunks = list(chunks or [b""])
        self.sent: list[Message] = []
        self.disconnect = anyio.Event()
        self.body_sent = anyio.Event()

    async def receive(self) -> Message:
        if self.chunks:
            body = self.chunks.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.body_sent.set()
            self.disconnect.set()

    @property
    def status(self) -> int | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                return int(message["status"])
        return None

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    def header(self, name: bytes) -> bytes | None:
        for message in self.sent:
            if message["type"] == "http.response.start":
                for key, value in message["headers"]:
                    if key.lower() == name:
                        return bytes(value)
        return None


async def call(
    app: Callable[..., Awaitable[None]], client: RawClient, path: str, method: str = "POST", **kw: Any
) -> None:
    await app(http_scope(path, method, **kw), client.receive, client.send)
