"""What `AdaptiveGate(app, **options)` shows of its options to type checkers and to `help()`:
the types each accepts as a caller writes it, and a signature made from the one declaration of
the options (`adaptive_gate.options.GateOptions`)."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import Field
from typing import Any, TypedDict

from starlette.types import Scope

from .._control.control import Controller
from .._observe.diagnostics import Diagnostics
from ..probes import Probe

__all__ = ["GateKeywords", "signature_of_options"]


class GateKeywords(TypedDict, total=False):
    """What a type checker sees of `AdaptiveGate(app, **options)`: the types each option accepts as
    a caller writes it (a tag as a string, paths as a tuple). The names, defaults and meanings are
    `GateOptions`' (`adaptive_gate.options`); a test holds the two to the same names."""

    tag: str | enum.Enum | list[str] | tuple[str, ...] | frozenset[str] | None
    initial_limit: int | None
    min_limit: int
    max_limit: int
    max_queue: int
    queue_timeout: float
    probe: Probe | str | None
    controller: Controller | None
    reject_status: int
    max_retry_after: int
    sample_period: float
    probe_timeout: float
    status_path: str | None
    metrics_path: str | None
    dashboard_path: str | None
    ready_path: str | None
    limits_path: str | None
    admin_token: str | None
    unprotected: tuple[str, ...] | list[str] | frozenset[str]
    health_paths: tuple[str, ...] | list[str] | frozenset[str]
    workers: int | None
    diagnostics: Diagnostics | None
    max_body_bytes: int
    max_buffered_bytes: int
    body_timeout: float
    send_timeout: float
    cost: Callable[[Scope], float] | None
    priority: str | Callable[[Scope], int] | None
    tenant: str | Callable[[Scope], str | None] | None
    priority_aging: float
    overload: str
    queue_target: float | None
    clock: Callable[[], float]


def signature_of_options(first: list[inspect.Parameter], options: tuple[Field[Any], ...]) -> inspect.Signature:
    """The keyword signature that `help(AdaptiveGate)` and editors show, made from the options'
    fields (the defaults as a caller writes them) and `GateKeywords` (the types)."""
    accepted = GateKeywords.__annotations__
    keywords = [
        inspect.Parameter(
            option.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=option.metadata["given"],
            annotation=getattr(accepted[option.name], "__forward_arg__", accepted[option.name]),
        )
        for option in options
    ]
    return inspect.Signature([*first, *keywords])
