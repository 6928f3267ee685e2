"""Which requests are gated: those routed to an endpoint whose tags hold the gate's tag.

Which routes are gated is worked out once per route when the table is built; a request then walks
the routes in the order the router does and stops at the first full match, as the router itself
will. The answer for a (method, path) is remembered in a bounded table (cleared when full, so
distinct URLs cannot make it grow without bound).

FastAPI 0.137+ keeps included routers as private nodes without `.path` or `.tags`;
`fastapi.routing.iter_route_contexts` flattens them and gives each route its effective tags,
including those passed to `include_router(..., tags=[...])`. Plain Starlette routes have no tags,
so with Starlette alone only `tag=None` (gate every request) or routes carrying `tags` are gated.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from starlette.routing import Host, Match, Mount, Route, WebSocketRoute
from starlette.types import Scope

from .._checks import normalise_tag
from .._observe.watch import GatedRoute

logger = logging.getLogger("adaptive_gate")

MAX_ANSWERS = 1024


class _Node:
    """One route. Plain HTTP routes keep their regex and methods, to be matched without the
    route's own `matches()` (which builds dicts and converts parameters we don't need)."""

    __slots__ = ("route", "gated", "children", "regex", "methods", "gated_route")

    def __init__(self, route: Any, gated: bool, children: list[_Node] | None) -> None:
        self.route = route
        self.gated = gated
        self.children = children
        self.regex: re.Pattern[str] | None = None
        self.methods: frozenset[str] | None = None
        original = getattr(route, "original_route", route)
        if children is None and isinstance(original, Route) and _plain_matches(original):
            self.regex = route.path_regex
            self.methods = frozenset(route.methods) if route.methods else None
        methods = ",".join(sorted(self.methods - {"HEAD"} or self.methods)) if self.methods else "*"
        endpoint = getattr(route, "endpoint", None)
        self.gated_route = GatedRoute(
            f"{methods} {getattr(route, 'path', '?')}",
            inspect.iscoroutinefunction(endpoint)
            or callable(endpoint)
            and inspect.iscoroutinefunction(endpoint.__call__),
        )


def _expand(routes: Sequence[Any]) -> Iterable[Any]:
    # FastAPI is optional, and loaded already wherever it routes: never import it from here.
    fastapi_routing = sys.modules.get("fastapi.routing")
    flatten: Callable[[Sequence[Any]], Iterable[Any]] | None = getattr(fastapi_routing, "iter_route_contexts", None)
    if flatten is None:
        return routes
    try:
        return list(flatten(routes))
    except Exception:  # an exotic route that FastAPI cannot flatten: take the routes as they are
        return routes


def _build(routes: Sequence[Any], wanted: frozenset[str]) -> list[_Node]:
    nodes: list[_Node] = []
    for route in _expand(routes):
        if not callable(getattr(route, "matches", None)):
            continue
        if isinstance(getattr(route, "original_route", route), Mount | Host):
            sub = _build(route.routes, wanted)
            nodes.append(_Node(route, any(n.gated for n in sub), sub))
        else:
            tags = {normalise_tag(t) for t in getattr(route, "tags", None) or ()}
            nodes.append(_Node(route, not wanted.isdisjoint(tags), None))
    # Past the last gated route nothing can be gated: requests stop looking there.
    last_gated = max((i for i, node in enumerate(nodes) if node.gated), default=-1)
    return nodes[: last_gated + 1]


def route_path(scope: Scope) -> str:
    """The path the router matches: the URL path less the `root_path` of the app or mount."""
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    rest = path[len(root_path) :]
    return rest if rest.startswith("/") or not rest else path


def _gated(nodes: list[_Node], scope: Scope, path: str) -> GatedRoute | None:
    """`path`: `route_path(scope)`, which the caller has already worked out."""
    method = scope["method"]
    for node in nodes:
        if node.regex is not None:
            if node.regex.match(path) is None or (node.methods is not None and method not in node.methods):
                continue  # no match, or a partial one (wrong method): the router keeps looking too
            return node.gated_route if node.gated else None
        match, child_scope = node.route.matches(scope)
        if match is not Match.FULL:
            continue
        if node.children is None:
            return node.gated_route if node.gated else None
        inner = {**scope, **child_scope}
        return _gated(node.children, inner, route_path(inner))
    return None


class RouteTable:
    """The gated routes of one application, rebuilt only when its route list changes size.

    The routes are those of `scope["app"]`, which Starlette sets before its middleware runs. A gate
    that wraps the application from outside (`AdaptiveGate(app)`) runs before that: it finds them
    on the application it wraps, or on the first app down its chain of `.app` that has routes.
    """

    def __init__(
        self,
        tags: frozenset[str] | None,
        *,
        fallback_app: object = None,
        endpoints: dict[str, str] | None = None,
        health_paths: Iterable[str] = (),
    ) -> None:
        self._tags = tags
        self._endpoints = endpoints or {}  # path -> the name of the gate's own endpoint there
        self._health_paths = frozenset(health_paths)
        self._fallback = _routed_app(fallback_app)
        self._app: Any = None
        self._size = -1
        self._nodes: list[_Node] = []
        self._warned = False
        # (method, path) -> the answer: most services see few distinct paths, and a walk of the
        # routes costs a regex per route. Bounded (cleared when full), and off where a Host route
        # makes the answer depend on more than the path. `decide` keeps its whole decisions here.
        self._answers: dict[tuple[str, str], GatedRoute | None] | None = {}
        self._signature: object = None

    def notice_changes(self) -> None:
        """On the monitor's tick: a change that keeps the number of routes (one replaced, one added
        to a router included earlier) has the table built again at the next request. Appended
        routes are seen at once, by the count."""
        if self._app is not None and _signature(self._app) != self._signature:
            self._size = -1

    def decide(self, scope: Scope) -> GatedRoute | str | None:
        """What the gate does with an HTTP request: the name of the gate's own endpoint it is for, the
        gated route it goes to, or None (to the application, ungated: a health check, or no gated
        route). Every request asks: while the routes are as they were, one lookup by method and path."""
        answers = self._answers
        if answers is not None and not scope.get("root_path"):  # then the path is the route path
            app: Any = scope.get("app")
            if self._tags is None or app is self._app and app is not None and len(app.routes) == self._size:
                try:
                    return answers[scope["method"], scope["path"]]
                except KeyError:
                    pass
        path = route_path(scope)
        endpoint = self._endpoints.get(path)
        if endpoint is not None:
            return endpoint
        route = self.match(scope, path)
        remember = self._tags is None  # with tags, `match` remembered its answer (where it may)
        if route is not None and path in self._health_paths:
            route, remember = None, True  # never gated; what `match` remembered is corrected
        answers = self._answers  # `match` may have built the table again
        if remember and answers is not None:
            if len(answers) >= MAX_ANSWERS:
                answers.clear()
            answers[scope["method"], path] = route
        return route

    def match(self, scope: Scope, path: str) -> GatedRoute | None:
        """The gated route this request (`path`: its `route_path`) goes to, or None if not gated."""
        if self._tags is None:
            return EVERY_REQUEST
        app = scope.get("app")
        routes = getattr(app, "routes", None)
        if routes is None:
            app = self._fallback
            routes = getattr(app, "routes", None)
            if routes is None:
                if not self._warned:
                    self._warned = True
                    logger.warning(
                        "adaptive_gate: no routes found (scope['app'] has none, nor does the wrapped app), so "
                        "no request is gated by tag; use app.add_middleware(AdaptiveGate) or tag=None"
                    )
                return None
        if app is not self._app or len(routes) != self._size:
            self._nodes = _build(routes, self._tags)
            self._app, self._size = app, len(routes)
            self._signature = _signature(app)
            self._answers = {} if _path_decides(self._nodes) else None
        answers = self._answers
        if answers is None:
            return _gated(self._nodes, scope, path)
        key = (scope["method"], path)
        try:
            return answers[key]
        except KeyError:
            pass
        if len(answers) >= MAX_ANSWERS:
            answers.clear()
        answer = answers[key] = _gated(self._nodes, scope, path)
        return answer


def _signature(app: object) -> object:
    """What identifies an application's routes as they are: which route objects, and FastAPI's
    own version count of its routers (it changes when an included router gains a route)."""
    routes = getattr(app, "routes", ())
    version = getattr(getattr(app, "router", None), "_get_routes_version", None)
    try:
        return tuple(map(id, routes)), version() if callable(version) else None
    except Exception:  # a router that cannot say: the route objects alone
        return tuple(map(id, routes)), None


def _plain_matches(route: Route) -> bool:
    """Whether `route` matches as Starlette's and FastAPI's own routes do: by path and method alone.
    A subclass with its own `matches()` (a header-based version, say) is asked every time."""
    plain = [Route.matches]
    fastapi_routing = sys.modules.get("fastapi.routing")
    api_route = getattr(fastapi_routing, "APIRoute", None)
    if api_route is not None:
        plain.append(api_route.matches)
    return type(route).matches in plain


def _path_decides(nodes: list[_Node]) -> bool:
    """Whether method and path alone decide every answer: not with a Host route (the host header
    decides) nor with a route that has its own `matches()`."""
    for node in nodes:
        original = getattr(node.route, "original_route", node.route)
        if isinstance(original, Host):
            return False
        if node.children is None and node.regex is None and not isinstance(original, WebSocketRoute):
            return False
        if node.children is not None and not _path_decides(node.children):
            return False
    return True


def _routed_app(app: object, depth: int = 32) -> object:
    """The first of `app`, `app.app`, `app.app.app`... that has routes, or None."""
    for _ in range(depth):
        if app is None or getattr(app, "routes", None) is not None:
            return app
        app = getattr(app, "app", None)
    return None


# With `tag=None` every request is gated, and which endpoint serves it is not looked up.
EVERY_REQUEST = GatedRoute("* (tag=None)", False)
