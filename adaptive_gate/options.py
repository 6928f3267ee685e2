"""The gate's options, declared once: each field of `GateOptions` holds its default, what it
accepts and what it means.

`AdaptiveGate(app, **options)` hands its keywords here; every later reader (the core, the
endpoints, the status, the reference page of the documentation) reads this one declaration, so an
option is named, checked, shown and documented in one place and the four cannot drift. Units are
in what each accepts (seconds for the timeouts and periods, bytes for the body bounds).
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, TypeVar

from starlette.types import Scope

from ._checks import (
    check_class_option,
    check_health_paths,
    check_int,
    check_paths,
    check_probe,
    check_seconds,
    check_tags,
    check_token,
    check_unprotected,
)
from ._control.control import Controller
from ._gate.admission import OVERLOAD_MODES
from ._observe.diagnostics import Diagnostics

__all__ = [
    "HEALTH_PATHS", "MAX_QUEUE", "PATH_OPTIONS", "PROTECTABLE", "GateOptions", "gate_options",
    "option_table",
]  # fmt: skip

HEALTH_PATHS = ("/health", "/healthz", "/livez", "/readyz")
MAX_QUEUE = 1 << 16  # a bigger queue only holds requests past any deadline a client keeps
PROTECTABLE = ("status", "metrics", "dashboard")
PATH_OPTIONS = ("status_path", "metrics_path", "dashboard_path", "ready_path", "limits_path")

T = TypeVar("T")


def option(
    default: T,
    accepts: str,
    meaning: str,
    *,
    collaborator: bool = False,
    shown_default: str | None = None,
    given: object = None,
    repr: bool = True,
    compare: bool = True,
) -> T:
    """One option: its default, what it accepts and what it means, for the checks, the status and
    the reference page alike. A collaborator (the controller, the diagnostics, the clock) is an
    object the gate works with, not a setting: the status does not show it. `given`: the default
    as a caller would write it, where the field keeps it in another form (a tag as a set)."""
    metadata = {
        "accepts": accepts,
        "meaning": meaning,
        "collaborator": collaborator,
        "shown_default": shown_default,
        "given": default if given is None else given,
    }
    made: T = field(default=default, metadata=metadata, repr=repr, compare=compare)
    return made


@dataclass(frozen=True)
class GateOptions:
    """What `AdaptiveGate` was configured with (the reference page renders each option from here).

    Each field's metadata says what it accepts and means (`option_table()` renders them). `tag`
    holds the set of tags (or None: every request); `probe` the probe object, `"auto"` or None;
    `admin_token` never shows in the status, only whether it is set.
    """

    tag: frozenset[str] | None = option(
        frozenset({"gpu"}),
        'a tag such as `"gpu"`, a list of tags, or `None`',
        "routes whose tags hold it (or, for a list, any of it) are gated; `None` gates every HTTP request",
        shown_default='"gpu"',
        given="gpu",
    )
    initial_limit: int | None = option(
        None, "an int in `[min_limit, max_limit]`, or `None` (= `min_limit`)", "the limit to start from"
    )
    min_limit: int = option(1, "an int >= 1", "the limit never goes below it (and never below 1)")
    max_limit: int = option(64, "an int >= `min_limit`", "the limit never goes above it")
    max_queue: int = option(
        128, f"an int in `[0, {MAX_QUEUE}]`", "requests that may wait; more are rejected at once (`0`: no queue)"
    )
    queue_timeout: float = option(
        30.0, "seconds >= 0", "a request's deadline, its work included (0: it runs if a slot is free at once, else 503)"
    )
    probe: object = option(
        "auto",
        '`"auto"`, `None`, or an object with `sample() -> MemorySample`',
        '`"auto"`: NVML (`nvidia-ml-py`), else `torch.cuda`, else none; `None`: OOMs alone teach the limit',
    )
    controller: Controller | None = option(
        None,
        "`None` (= `AIMD()`), `Fixed(n)`, or a `Controller`",
        "how the limit is chosen; each gate needs its own",
        collaborator=True,
    )
    reject_status: int = option(503, "`503` or `429`", "the status of a rejection")
    max_retry_after: int = option(60, "an int >= 1", "the cap of `Retry-After`, in seconds")
    sample_period: float = option(
        0.1, "seconds > 0", "mean time between probe readings (taken off the event loop, each wait ±25% at random)"
    )
    probe_timeout: float = option(1.0, "seconds > 0", "how long a probe reading may take before it counts as hung")
    status_path: str | None = option(
        "/gate/status", "a path, or `None`", "the status JSON; `None` turns it off (so for each path below)"
    )
    metrics_path: str | None = option(
        "/gate/metrics", "a path, or `None`", "Prometheus text format (needs the `metrics` extra)"
    )
    dashboard_path: str | None = option(
        "/gate/dashboard", "a path, or `None`", "a live page, self-contained; its data at `{dashboard_path}/data`"
    )
    ready_path: str | None = option(
        "/gate/ready",
        "a path, or `None`",
        "readiness: 200 (with `degraded` reasons, if any), or 503 with reasons when the queue is full",
    )
    limits_path: str | None = option(
        "/gate/limits", "a path, or `None`", "`PUT` a pin or bounds at run time; exists only with `admin_token`"
    )
    admin_token: str | None = option(
        None,
        "a str of 16 or more characters, or `None`",
        "a bearer token: status, metrics and dashboard answer 401 without it; never shown",
        repr=False,
    )
    unprotected: frozenset[str] = option(
        frozenset(),
        f"a tuple of {', '.join(f'`{name!r}`' for name in PROTECTABLE)}",
        "endpoints left open despite the token",
        shown_default="()",
        given=(),
    )
    health_paths: frozenset[str] = option(
        frozenset(HEALTH_PATHS),
        "a tuple of paths",
        "never gated, even with `tag=None`",
        shown_default=repr(HEALTH_PATHS),
        given=HEALTH_PATHS,
    )
    workers: int | None = option(
        None,
        "an int >= 1, or `None`",
        "worker processes serving the app, for the status; `None`: from `WEB_CONCURRENCY` or the server",
    )
    diagnostics: Diagnostics | None = option(
        None,
        "`None` (= `Diagnostics()`) or an `adaptive_gate.diagnostics.Diagnostics`",
        "the mistake detectors; their thresholds are its keyword arguments",
        collaborator=True,
    )
    max_body_bytes: int = option(
        32 << 20, "bytes >= 0", "a gated request's body may be this large; more is `413`", shown_default="32 MiB"
    )
    max_buffered_bytes: int = option(
        256 << 20,
        "bytes >= `max_body_bytes`",
        "the bodies read but not yet admitted, together; more is `503 queue_full`",
        shown_default="256 MiB",
    )
    body_timeout: float = option(
        30.0, "seconds > 0", "how long a gated request's body may take to arrive (never past its deadline); then `408`"
    )
    send_timeout: float = option(
        30.0, "seconds > 0", "how long one send to the client may block; then the response is abandoned"
    )
    cost: Callable[[Scope], float] | None = option(
        None,
        "`None`, or a callable `(scope) -> float` (> 0)",
        "what a request weighs in slots, a typical request about 1 (a batch size, pixels or tokens); "
        "`None`: every request weighs 1",
    )
    priority: object = option(
        None,
        '`None`, a header name (`"x-priority"`), or `(scope) -> int`',
        "larger is served first and shed last; absent or malformed is 0; clamped to [-100, 100]",
        compare=False,
    )
    tenant: object = option(
        None,
        '`None`, a header name (`"x-tenant"`), or `(scope) -> str | None`',
        "tenants with requests waiting take turns; absent is one tenant of its own",
        compare=False,
    )
    priority_aging: float = option(
        10.0, "seconds > 0", "waiting worth one priority level, so the lowest is never starved"
    )
    overload: str = option(
        "lifo",
        ", ".join(f"`{mode!r}`" for mode in OVERLOAD_MODES),
        "while more arrive than the card serves: newest first, turn away at arrival, or nothing",
    )
    queue_target: float | None = option(
        None,
        "seconds > 0, or `None`",
        "queueing above which the line counts as standing; `None`: the routes' mean service time",
    )
    clock: Callable[[], float] = option(
        time.monotonic,
        "a callable `() -> float`",
        "the monotonic clock the gate's events are stamped with (a test can replay a run on a fake one)",
        collaborator=True,
        shown_default="time.monotonic",
    )

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put("tag", check_tags(self.tag))
        _collaborators(self.diagnostics, self.clock)
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
        put("probe", check_probe(self.probe))
        check_paths({name: getattr(self, name) for name in PATH_OPTIONS})
        put("admin_token", check_token(self.admin_token))
        put("unprotected", check_unprotected(self.unprotected, PROTECTABLE))
        put("health_paths", check_health_paths(self.health_paths))
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
            if option.metadata["collaborator"]:
                continue
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


def gate_options(options: dict[str, Any]) -> GateOptions:
    """`GateOptions(**options)`, with an error that names the option meant where one is misspelt."""
    known = {option.name for option in fields(GateOptions)}
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise TypeError(
                f"AdaptiveGate got an unknown option {name!r}; {hint}the options are {', '.join(sorted(known))} "
                "(see the reference's option table)"
            )
    return GateOptions(**options)


def option_table() -> list[dict[str, str]]:
    """Each option as the reference page shows it: name, default, what it accepts, what it means."""
    return [
        {
            "name": option.name,
            "default": option.metadata["shown_default"] or repr(_default(option)),
            "accepts": option.metadata["accepts"],
            "meaning": option.metadata["meaning"],
        }
        for option in fields(GateOptions)
    ]


def _default(option: Field[Any]) -> Any:
    assert option.default is not MISSING, f"option {option.name} has no default"
    return option.default


def _collaborators(diagnostics: object, clock: object) -> None:
    """The controller is checked where it is bound, by the core."""
    if diagnostics is not None and not isinstance(diagnostics, Diagnostics):
        raise TypeError(
            f"diagnostics must be an adaptive_gate.diagnostics.Diagnostics(...) or None, got {diagnostics!r}"
        )
    if not callable(clock):
        raise TypeError(f"clock must be a callable () -> float of monotonic seconds, got {clock!r}")
