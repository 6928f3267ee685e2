"""Checks of configuration values, shared by the gate's options, the controllers and the
diagnostics: each says what is wrong with a value, and what would be right, before anything runs
with it."""

from __future__ import annotations

import enum
import math

__all__ = [
    "MAX_BYTES", "check_bytes", "check_class_option", "check_fraction", "check_health_paths", "check_int",
    "check_number", "check_paths", "check_probe", "check_seconds", "check_tags", "check_token", "check_unprotected",
    "normalise_tag",
]  # fmt: skip

MIN_TOKEN_CHARS = 16
# No device holds an exabyte; a larger figure is a probe's mistake, and would overflow float arithmetic.
MAX_BYTES = 2**60


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_real(name: str, value: object, what: str = "a number") -> float:
    """An int or a float (not a bool, not a numeric string), or a TypeError saying it must be `what`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    return value


def check_number(name: str, value: object, *, allow_zero: bool = True, finite: bool = False, unit: str = "") -> float:
    """A number >= 0 (> 0 unless `allow_zero`), never NaN; where `finite`, never infinite either (a run
    of endless seconds, or readings every 0 s, never ends). `unit` names what it counts, for the message."""
    value = check_real(name, value, f"a number{f' of {unit}' if unit else ''}")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero) or (finite and value == math.inf):
        bound = f"{'a finite number ' if finite else ''}{'>= 0' if allow_zero else '> 0'}{f' {unit}' if unit else ''}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return float(value)


def check_seconds(name: str, value: object, *, allow_zero: bool = True) -> float:
    return check_number(name, value, allow_zero=allow_zero, unit="seconds")


def check_bytes(name: str, value: object) -> int:
    """A whole, non-negative, plausible number; an integral float (some bindings return them) is taken."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != math.floor(value):
            raise ValueError(f"{name} must be a whole number of bytes or events, got {value!r}")
        value = int(value)
    if not 0 <= value <= MAX_BYTES:
        raise ValueError(f"{name} must be in [0, 2**60], got {value}")
    return int(value)


def check_fraction(name: str, value: float, *, low: float = 0.0, high: float = 1.0) -> float:
    if not low < check_real(name, value) <= high:
        raise ValueError(f"{name} must be in ({low}, {high}], got {value}")
    return float(value)


def check_tags(tag: object) -> frozenset[str] | None:
    """One tag, or several (FastAPI's tags are lists, so a list is natural); None gates every request."""
    if tag is None:
        return None
    tags: frozenset[str] | None = None
    if isinstance(tag, str | enum.Enum):
        tags = frozenset({normalise_tag(tag)})
    elif isinstance(tag, list | tuple | set | frozenset) and tag and all(isinstance(t, str | enum.Enum) for t in tag):
        tags = frozenset(normalise_tag(t) for t in tag)
    if tags is None:
        raise TypeError(f'tag must be a str such as "gpu", a list of them, or None (gate every request); got {tag!r}')
    if any(not t.strip() for t in tags):
        # A slip (an unset variable, a stray comma): the gate would stand in front of nothing.
        empty = f"got an empty one in {tag!r}; None gates every request"
        raise ValueError(f'tag must name a route tag such as "gpu", {empty}')
    return tags


def check_probe(probe: object) -> object:
    if probe is None or probe == "auto":
        return probe
    if isinstance(probe, str):
        raise ValueError(f"probe must be 'auto', None or an object with sample(), got {probe!r}")
    if isinstance(probe, type):
        name = probe.__name__
        raise TypeError(f"probe must be an instance, not the class: probe={name}(...), not probe={name}")
    if not callable(getattr(probe, "sample", None)):
        raise TypeError(f"probe must have a sample() method returning a MemorySample, got {probe!r}")
    return probe


def check_paths(paths: dict[str, object]) -> None:
    seen: dict[object, str] = {}
    for name, path in paths.items():
        if path is None:
            continue
        if not isinstance(path, str) or not path.startswith("/") or path.endswith("/") and path != "/":
            raise ValueError(f"{name} must be a path starting with '/' (no trailing '/'), or None; got {path!r}")
        if path in seen:
            raise ValueError(f"{name} and {seen[path]} are both {path!r}: give each endpoint its own path")
        seen[path] = name


def check_token(admin_token: object) -> str | None:
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


def check_unprotected(unprotected: object, protectable: tuple[str, ...]) -> frozenset[str]:
    if isinstance(unprotected, str) or not isinstance(unprotected, tuple | list | set | frozenset):
        raise TypeError(f"unprotected must be a tuple of endpoint names such as ('metrics',), got {unprotected!r}")
    unknown = set(unprotected) - set(protectable)
    if unknown:
        raise ValueError(f"unprotected may name {', '.join(protectable)}; got {sorted(unknown)}")
    return frozenset(unprotected)


def check_health_paths(health_paths: object) -> frozenset[str]:
    if isinstance(health_paths, str) or not isinstance(health_paths, tuple | list | set | frozenset):
        raise TypeError(f"health_paths must be a tuple of paths such as ('/healthz',), got {health_paths!r}")
    for path in health_paths:
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"health_paths must be paths starting with '/', such as '/healthz'; got {path!r}")
    return frozenset(health_paths)


def normalise_tag(tag: object) -> str:
    return str(tag.value) if isinstance(tag, enum.Enum) else str(tag)


def check_class_option(name: str, value: object) -> object:
    """`None`, a header name (kept lower-case, as ASGI gives header names), or a callable."""
    if value is None or callable(value):
        return value
    if isinstance(value, str) and value.strip() and value.isascii() and " " not in value:
        return value.lower()
    kind = "int" if name == "priority" else "str | None"
    raise TypeError(
        f'{name} must be None, a header name such as "x-{name}", or a callable (scope) -> {kind}; got {value!r}'
    )
