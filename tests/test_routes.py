"""Which requests the gate stands in front of: the routes tagged `gpu`, wherever they are declared."""

from __future__ import annotations

import enum

import anyio
import httpx
import pytest
from fastapi import APIRouter, FastAPI
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Host, Mount, Route, WebSocketRoute
from starlette.websockets import WebSocket

from adaptive_gate import AdaptiveGate

from .helpers import find_gate

pytestmark = pytest.mark.anyio


class Tags(enum.Enum):
    gpu = "gpu"


def build_app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None)

    @app.post("/direct", tags=["gpu"])
    def direct() -> dict[str, str]:
        return {"route": "direct"}

    @app.post("/enum", tags=[Tags.gpu])
    def enum_tagged() -> dict[str, str]:
        return {"route": "enum"}

    @app.get("/plain")
    def plain() -> dict[str, str]:
        return {"route": "plain"}

    @app.get("/items/{item_id}", tags=["other"])
    def other(item_id: int) -> dict[str, int]:
        return {"item": item_id}

    tagged_at_include = APIRouter()

    @tagged_at_include.post("/predict/{model}")
    def predict(model: str) -> dict[str, str]:
        return {"model": model}

    @tagged_at_include.get("/info")
    def info() -> dict[str, str]:
        return {"route": "info"}

    app.include_router(tagged_at_include, prefix="/v1", tags=["gpu"])

    inner = APIRouter(tags=["gpu"])

    @inner.post("/deep")
    def deep() -> dict[str, str]:
        return {"route": "deep"}

    outer = APIRouter()
    outer.include_router(inner, prefix="/inner")
    app.include_router(outer, prefix="/outer")

    sub = FastAPI()

    @sub.post("/embed", tags=["gpu"])
    def embed() -> dict[str, str]:
        return {"route": "embed"}

    @sub.get("/free")
    def free() -> dict[str, str]:
        return {"route": "free"}

    app.mount("/sub", sub)
    return app


async def admitted_after(app: FastAPI, method: str, path: str) -> tuple[int, int]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        await client.get("/gate/status")  # builds the middleware stack
        before = find_gate(app).statistics().counters["admitted"]
        response = await client.request(method, path)
        return response.status_code, find_gate(app).statistics().counters["admitted"] - before


@pytest.mark.parametrize(
    ("method", "path", "gated"),
    [
        ("POST", "/direct", True),
        ("POST", "/enum", True),
        ("GET", "/plain", False),
        ("GET", "/items/3", False),
        ("POST", "/v1/predict/resnet", True),  # tags given to include_router, prefix, path parameter
        ("GET", "/v1/info", True),
        ("POST", "/outer/inner/deep", True),  # nested routers, tags on the inner router
        ("POST", "/sub/embed", True),  # a mounted sub-application's tagged route
        ("GET", "/sub/free", False),
        ("GET", "/nowhere", False),  # unknown paths pass through to the app's 404
        ("GET", "/direct", False),  # wrong method: the router answers 405, nothing to gate
    ],
)
async def test_gates_exactly_the_tagged_routes(method: str, path: str, gated: bool) -> None:
    status, admitted = await admitted_after(build_app(), method, path)
    assert admitted == (1 if gated else 0)
    if path == "/nowhere":
        assert status == 404
    elif path == "/direct" and method == "GET":
        assert status == 405
    else:
        assert status == 200


async def test_first_matching_route_decides() -> None:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None)

    @app.get("/things/special")
    def special() -> dict[str, str]:
        return {"route": "special"}

    @app.get("/things/{name}", tags=["gpu"])
    def thing(name: str) -> dict[str, str]:
        return {"route": name}

    assert (await admitted_after(app, "GET", "/things/special"))[1] == 0
    assert (await admitted_after(app, "GET", "/things/other"))[1] == 1


async def test_table_is_per_route_not_per_url() -> None:
    app = build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        await client.post("/v1/predict/first")
        gate = find_gate(app)
        nodes = gate._routes._nodes
        for i in range(300):
            await client.post(f"/v1/predict/m{i}")
        assert gate._routes._nodes is nodes  # not rebuilt, and it holds routes, not URLs
        assert gate.statistics().counters["admitted"] == 301


async def test_answers_per_path_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("adaptive_gate._http.routes.MAX_ANSWERS", 16)
    app = build_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        for i in range(100):
            await client.post(f"/v1/predict/m{i}")
            await client.get("/plain")
        table = find_gate(app)._routes
        assert table._answers is not None and 0 < len(table._answers) <= 16  # distinct URLs: bounded
        assert table._answers.get(("GET", "/plain"), "absent") is None  # remembered: not gated
        assert find_gate(app).statistics().counters["admitted"] == 100  # every predict, none of the plain ones


async def test_a_host_route_turns_the_remembered_answers_off() -> None:
    inner = Starlette(routes=[Route("/infer", PlainTextResponse("gpu"), methods=["POST"])])
    inner.routes[0].tags = ["gpu"]  # type: ignore[attr-defined]
    app = Starlette(routes=[Host("gpu.example", inner), Route("/infer", PlainTextResponse("cpu"), methods=["POST"])])
    app.add_middleware(AdaptiveGate, probe=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        on_gpu_host = await client.post("/infer", headers={"host": "gpu.example"})
        elsewhere = await client.post("/infer")
        again_on_gpu_host = await client.post("/infer", headers={"host": "gpu.example"})
    gate = find_gate(app)
    assert (on_gpu_host.text, elsewhere.text, again_on_gpu_host.text) == ("gpu", "cpu", "gpu")
    assert gate._routes._answers is None  # the host decides, not the path alone
    assert gate.statistics().counters["admitted"] == 2


async def test_routes_added_later_are_seen() -> None:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
        await client.get("/gate/status")

        @app.post("/late", tags=["gpu"])
        def late() -> dict[str, str]:
            return {}

        assert (await client.post("/late")).status_code == 200
        assert find_gate(app).statistics().counters["admitted"] == 1


async def test_custom_tag() -> None:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, tag="heavy", probe=None)

    @app.post("/a", tags=["heavy"])
    def a() -> dict[str, str]:
        return {}

    @app.post("/b", tags=["gpu"])
    def b() -> dict[str, str]:
        return {}

    assert (await admitted_after(app, "POST", "/a"))[1] == 1
    assert (await admitted_after(app, "POST", "/b"))[1] == 0


async def test_plain_starlette_with_tag_none_gates_everything_but_status() -> None:
    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    app = Starlette(routes=[Route("/hello", hello), Mount("/m", routes=[Route("/x", hello)])])
    app.add_middleware(AdaptiveGate, tag=None, probe=None)
    assert (await admitted_after(app, "GET", "/hello"))[1] == 1  # type: ignore[arg-type]
    assert (await admitted_after(app, "GET", "/m/x"))[1] == 1  # type: ignore[arg-type]
    assert (await admitted_after(app, "GET", "/gate/status"))[1] == 0  # type: ignore[arg-type]


async def test_plain_starlette_routes_have_no_tags_so_nothing_is_gated() -> None:
    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hi")

    app = Starlette(routes=[Route("/hello", hello)])
    app.add_middleware(AdaptiveGate, probe=None)
    assert (await admitted_after(app, "GET", "/hello"))[1] == 0  # type: ignore[arg-type]


async def test_websockets_pass_through() -> None:
    async def ws_endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    app = Starlette(routes=[WebSocketRoute("/ws", ws_endpoint)])
    app.add_middleware(AdaptiveGate, tag=None, probe=None)  # even when every HTTP request is gated
    messages: list[dict[str, object]] = []
    inbox = [{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1000}]

    async def receive() -> dict[str, object]:
        return inbox.pop(0)

    async def send(message: dict[str, object]) -> None:
        messages.append(message)

    scope = {"type": "websocket", "path": "/ws", "raw_path": b"/ws", "root_path": "", "query_string": b"",
             "headers": [], "scheme": "ws", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
             "subprotocols": [], "asgi": {"version": "3.0"}}  # fmt: skip
    await app(scope, receive, send)
    assert [m["type"] for m in messages] == ["websocket.accept", "websocket.send", "websocket.close"]
    assert find_gate(app).statistics().counters["admitted"] == 0


async def test_a_route_added_to_an_included_router_later_is_seen_within_a_tick() -> None:
    from asgi_lifespan import LifespanManager

    router = APIRouter()

    @router.get("/known")
    def known() -> dict[str, str]:
        return {}

    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None)
    app.include_router(router, prefix="/r")
    async with (
        LifespanManager(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client,
    ):
        await client.get("/r/known")

        @router.post("/late", tags=["gpu"])  # the app's own route list keeps its length
        def late() -> dict[str, str]:
            return {}

        gate = find_gate(app)
        await anyio.sleep(0.3)  # a few monitor ticks
        assert (await client.post("/r/late")).status_code == 200
    assert gate.statistics().counters["admitted"] == 1


async def test_a_route_with_its_own_matches_is_asked() -> None:
    from fastapi.routing import APIRoute
    from starlette.routing import Match
    from starlette.types import Scope

    class V2Route(APIRoute):
        def matches(self, scope: Scope) -> tuple[Match, Scope]:
            if (b"x-api-version", b"2") not in scope.get("headers", []):
                return Match.NONE, {}
            return super().matches(scope)

    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None)
    app.router.routes.append(V2Route("/infer", lambda: {"v": 2}, methods=["POST"], tags=["gpu"]))
    app.router.routes.append(APIRoute("/infer", lambda: {"v": 1}, methods=["POST"]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
        v1 = await client.post("/infer")
        v2 = await client.post("/infer", headers={"x-api-version": "2"})
        v1_again = await client.post("/infer")
    assert (v1.json(), v2.json(), v1_again.json()) == ({"v": 1}, {"v": 2}, {"v": 1})
    assert find_gate(app).statistics().counters["admitted"] == 1  # the v2 request only
