"""The gate's options, checked once into one frozen object that the status renders as it is.

`AdaptiveGate(app, **options)` hands its keywords here; every later reader (the core, the
endpoints, the status) reads this object, so an option is named, checked and shown in one place.
The keyword names are the public ones of the README; units are in the docstring (seconds for the
timeouts and periods, bytes for the body bounds).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from starlette.types import Scope

from ._admission import OVERLOAD_MODES
from ._checks import check_int, check_seconds
from ._classify import check_class_option
from ._routes import normalise_tag

__all__ = ["HEALTH_PATHS", "MAX_QUEUE", "PATH_OPTIONS", "PROTECTABLE", "GateOptions"]

HEALTH_PATHS = ("/health", "/healthz", "/livez", "/readyz")
MAX_QUEUE = 1 << 16  # a bigger queue only holds requests past any deadline a client keeps
MIN_TOKEN_CHARS = 16
PROTECTABLE = ("status", "metrics", "dashboard")
PATH_OPTIONS = ("status_path", "metrics_path", "dashboard_path", "ready_path", "limits_path")


@dataclass(frozen=True)
class GateOptions:
    """What `AdaptiveGate` was configured with (see the README's option table for each meaning).

    `tag` holds the set of tags (or None: every request); `probe` the probe object, `"auto"` or
    None; `admin_token` never shows in the status, only whether it is set.
    """

    tag: frozenset[str] | None = frozenset({"gpu"})
    initial_limit: int | None = None
    min_limit: int = 1
    max_limit: int = 64
    max_queue: int = 128
    queue_timeout: float = 30.0
    probe: object = "auto"
    reject_status: int = 503
    max_retry_after: int = 60
    sample_period: float = 0.1
    probe_timeout: float = 1.0
    status_path: str | None = "/gate/status"
    metrics_path: str | None = "/gate/metrics"
    dashboard_path: str | None = "/gate/dashboard"
    ready_path: str | None = "/gate/ready"
    limits_path: str | None = "/gate/limits"
    admin_token: str | None = field(default=None, repr=False)
    unprotected: frozenset[str] = frozenset()
    health_paths: frozenset[str] = frozenset(HEALTH_PATHS)
    workers: int | None = None
    max_body_bytes: int = 32 << 20
    max_buffered_bytes: int = 256 << 20
    body_timeout: float = 30.0
    send_timeout: float = 30.0
    cost: Callable[[Scope], float] | None = None
    priority: object = field(default=None, compare=False)
    tenant: object = field(default=None, compare=False)
    priority_aging: float = 10.0
    overload: str = "lifo"
    queue_target: float | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put("tag", _tags(self.tag))
        check_int("min_limit", self.min_limit, 1)
        check_int("max_limit", self.max_limit, self.min_limit)
        if self.initial_limit is not None:
            check_int("initial_limit", self.initial_limit, self.min_limit, self.max_limit)
        check_int("max_queue", self.max_queue, 0, MAX_QUEUE)
        for name in ("queue_timeout", "sample_period", "probe_timeout", "body_timeout", "send_timeout"):
            put(name, check_seconds(name, getattr(self, name), allow_zero=name == "queue_timeout"))
        if self.reject_status not in (429, 503):
            raise ValueError(f"reject_status must be 503 or 429, got {self.reject_status!r}")
        check_int("max_retry_after", self.max_retry_after, 1)
        check_int("max_body_bytes", self.max_body_bytes, 0)
        check_int("max_buffered_bytes", self.max_buffered_bytes, self.max_body_bytes)
        if self.workers is not None:
            check_int("workers", self.workers, 1)
        put("probe", _probe(self.probe))
        _paths({name: getattr(self, name) for name in PATH_OPTIONS})
        put("admin_token", _token(self.admin_token))
        put("unprotected", _unprotected(self.unprotected))
        put("health_paths", _health_paths(self.health_paths))
        if self.cost is not None and not callable(self.cost):
            raise TypeError(
                "cost must be None (every request weighs 1) or a callable (scope) -> float that says what a "
                f"request weighs, e.g. its batch size read from the query string; got {self.cost!r}"
            )
        put("priority", check_class_option("priority", self.priority))
        put("tenant", check_class_option("tenant", self.tenant))
        put("priority_aging", check_seconds("priority_aging", self.priority_aging, allow_zero=False))
        if self.overload not in OVERLOAD_MODES:
            raise ValueError(
                f"overload must be one of {', '.join(map(repr, OVERLOAD_MODES))} (what the gate does while more "
                f"arrive than the card serves: newest first, shed at arrival, or nothing); got {self.overload!r}"
            )
        if self.queue_target is not None:
            put("queue_target", check_seconds("queue_target", self.queue_target, allow_zero=False))

    @property
    def protected(self) -> frozenset[str]:
        """The endpoints that need the token: none without one."""
        return frozenset(PROTECTABLE) - self.unprotected if self.admin_token else frozenset()

    def describe(self) -> dict[str, Any]:
        """The options as the status shows them: plain JSON, and the token only as set or not."""
        shown: dict[str, Any] = {}
        for option in fields(self):
            value = getattr(self, option.name)
            if option.name == "admin_token":
                shown["admin_token_set"] = value is not None
            elif option.name in ("probe", "cost", "priority", "tenant"):
                shown[option.name] = value if value is None or isinstance(value, str) else repr(value)
            elif option.name == "tag":
                shown["tag"] = None if value is None else min(value) if len(value) == 1 else sorted(value)
            elif isinstance(value, frozenset):
                shown[option.name] = sorted(value)
            else:
                shown[option.name] = value
        shown["protected"] = sorted(self.protected)
        return shown


def _tags(tag: object) -> frozenset[str] | None:
    """One tag, or several (FastAPI's tags are lists, so a list is natural); None gates every request."""
    if tag is None:
        return None
    if isinstance(tag, str | enum.Enum):
        return frozenset({normalise_tag(tag)})
    if isinstance(tag, list | tuple | set | frozenset) and tag and all(isinstance(t, str | enum.Enum) for t in tag):
        return frozenset(normalise_tag(t) for t in tag)
    raise TypeError(f'tag must be a str such as "gpu", a list of them, or None (gate every request); got {tag!r}')


def _probe(probe: object) -> object:
    if probe is None or probe == "auto":
        return probe
    if isinstance(probe, str):
        raise ValueError(f"probe must be 'auto', None or an object with sample(), got {probe!r}")
    if not callable(getattr(probe, "sample", None)):
        raise TypeError(f"probe must have a sample() method returning a MemorySample, got {probe!r}")
    return probe


def _paths(paths: dict[str, object]) -> None:
    seen: dict[object, str] = {}
    for name, path in paths.items():
        if path is None:
            continue
        if not isinstance(path, str) or not path.startswith("/") or path.endswith("/") and path != "/":
            raise ValueError(f"{name} must be a path starting with '/' (no trailing '/'), or None; got {path!r}")
        if path in seen:
            raise ValueError(f"{name} and {seen[path]} are both {path!r}: give each endpoint its own path")
        seen[path] = name


def _token(admin_token: object) -> str | None:
    if admin_token is None:
        return None
    if not isinstance(admin_token, str):
        raise TypeError(f"admin_token must be a str or None, got {type(admin_token).__name__}")
    if len(admin_token) < MIN_TOKEN_CHARS or admin_token.strip() != admin_token:
        raise ValueError(
            f"admin_token must be at least {MIN_TOKEN_CHARS} characters without surrounding spaces; make one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))' and pass it from an environment variable"
        )
    return admin_token


def _unprotected(unprotected: object) -> frozenset[str]:
    if isinstance(unprotected, str) or not isinstance(unprotected, tuple | list | set | frozenset):
        raise TypeError(f"unprotected must be a tuple of endpoint names such as ('metrics',), got {unprotected!r}")
    unknown = set(unprotected) - set(PROTECTABLE)
    if unknown:
        raise ValueError(f"unprotected may name {', '.join(PROTECTABLE)}; got {sorted(unknown)}")
    return frozenset(unprotected)


def _health_paths(health_paths: object) -> frozenset[str]:
    if isinstance(health_paths, str) or not isinstance(health_paths, tuple | list | set | frozenset):
        raise TypeError(f"health_paths must be a tuple of paths such as ('/healthz',), got {health_paths!r}")
    for path in health_paths:
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"health_paths must be paths starting with '/', such as '/healthz'; got {path!r}")
    return frozenset(health_paths)
