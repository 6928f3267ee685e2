"""Which requests are gated: those routed to an endpoint whose tags hold the gate's tag.

The answer is worked out once per route when the table is built, never per URL (a cache keyed by
path would grow without bound under distinct URLs); a request then only walks the routes in the
order the router does and stops at the first full match, as the router itself will.

FastAPI 0.137+ keeps included routers as private nodes without `.path` or `.tags`;
`fastapi.routing.iter_route_contexts` flattens them and gives each route its effective tags,
including those passed to `include_router(..., tags=[...])`. Plain Starlette routes have no tags,
so with Starlette alone only `tag=None` (gate every request) or routes carrying `tags` are gated.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from starlette.routing import Host, Match, Mount
from starlette.types import Scope


def normalise_tag(tag: object) -> str:
    return str(tag.value) if isinstance(tag, enum.Enum) else str(tag)


class _Node:
    __slots__ = ("route", "gated", "children")

    def __init__(self, route: Any, gated: bool, children: list[_Node] | None) -> None:
        self.route = route
        self.gated = gated
        self.children = children


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


def _build(routes: Sequence[Any], tag: str) -> list[_Node]:
    nodes: list[_Node] = []
    for route in _expand(routes):
        if not callable(getattr(route, "matches", None)):
            continue
        if isinstance(getattr(route, "original_route", route), Mount | Host):
            sub = _build(route.routes, tag)
            nodes.append(_Node(route, any(n.gated for n in sub), sub))
        else:
            tags = {normalise_tag(t) for t in getattr(route, "tags", None) or ()}
            nodes.append(_Node(route, tag in tags, None))
    # Past the last gated route nothing can be gated: requests stop looking there.
    last_gated = max((i for i, node in enumerate(nodes) if node.gated), default=-1)
    return nodes[: last_gated + 1]


def _gated(nodes: list[_Node], scope: Scope) -> bool:
    for node in nodes:
        match, child_scope = node.route.matches(scope)
        if match is not Match.FULL:
            continue
        if node.children is None:
            return node.gated
        sub_scope = {**scope, **child_scope}
        return _gated(node.children, sub_scope)
    return False


class RouteTable:
    """The gated routes of one application, rebuilt only when its route list changes size."""

    def __init__(self, tag: str | None) -> None:
        self._tag = tag
        self._app: object = None
        self._size = -1
        self._nodes: list[_Node] = []

    def is_gated(self, scope: Scope) -> bool:
        if self._tag is None:
            return True
        app = scope.get("app")
        routes = getattr(app, "routes", None)
        if routes is None:
            return False
        if app is not self._app or len(routes) != self._size:
            self._nodes = _build(routes, self._tag)
            self._app, self._size = app, len(routes)
        return _gated(self._nodes, scope)
