"""Reading a request's priority and tenant, as the `priority` and `tenant` options say.

Each option is `None` (nothing to read: every request is priority 0 and tenant None), a header
name, or a callable given the ASGI scope. A request is never failed for what it says about
itself: a header that is not an integer, or a callable that raises or answers something else,
counts as priority 0 (or no tenant). A callable's answer is the app's own code, not a client's:
any whole number will do for a priority (a numpy integer, 3.0), and the first time it raises or
answers something else (a tenant that is not a str: an id as a number is no name) is logged as a
warning, since every such request counts as unclassified. Priorities are clamped into
`[PRIORITY_MIN, PRIORITY_MAX]` and tenant names cut to `MAX_TENANT_CHARS`, so what a client sends
cannot grow the gate's tables.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable
from typing import Any

from starlette.types import Scope

from .._gate.accounts import PRIORITY_MAX, PRIORITY_MIN

__all__ = ["Classifier"]

logger = logging.getLogger("adaptive_gate")

MAX_TENANT_CHARS = 64


class Classifier:
    """The priority and tenant of one request, read once, before it may wait."""

    def __init__(self, priority: object, tenant: object) -> None:
        self.enabled = priority is not None or tenant is not None
        self._priority_header = priority.encode("latin-1") if isinstance(priority, str) else None
        self._priority_call: Callable[[Scope], Any] | None = None if isinstance(priority, str) else priority  # type: ignore[assignment]
        self._tenant_header = tenant.encode("latin-1") if isinstance(tenant, str) else None
        self._tenant_call: Callable[[Scope], Any] | None = None if isinstance(tenant, str) else tenant  # type: ignore[assignment]
        self._warned: set[str] = set()  # the callables whose answer was already warned of

    def classify(self, scope: Scope) -> tuple[int, str | None]:
        return self.priority(scope), self.tenant(scope)

    def priority(self, scope: Scope) -> int:
        value = self._read(scope, self._priority_header, self._priority_call, "priority")
        if isinstance(value, bytes):
            text = value.strip()
            negative = text.startswith(b"-")
            digits = text[1:] if negative else text
            if not digits.isdigit():
                return 0
            if len(digits) > 6:  # past either bound whatever the digits: clamped without converting them
                return PRIORITY_MIN if negative else PRIORITY_MAX
            value = -int(digits) if negative else int(digits)
        whole = _whole(value)
        if whole is None:
            if value is not None:
                self._wrong("priority", value, "a whole number")
            return 0
        return min(PRIORITY_MAX, max(PRIORITY_MIN, whole))

    def tenant(self, scope: Scope) -> str | None:
        value = self._read(scope, self._tenant_header, self._tenant_call, "tenant")
        if isinstance(value, bytes):
            value = value.decode("latin-1").strip()
        if value is not None and not isinstance(value, str):
            self._wrong("tenant", value, "a str")
            return None
        return value[:MAX_TENANT_CHARS] if value else None

    def _read(self, scope: Scope, header: bytes | None, call: Callable[[Scope], Any] | None, what: str) -> object:
        """The raw value: the header's bytes, or what the callable answered (None: none, or it raised)."""
        if header is not None:
            return _header(scope, header)
        if call is None:
            return None
        try:
            return call(scope)
        except Exception as error:  # the request is served as unclassified rather than failed for it
            if what not in self._warned:
                self._warned.add(what)
                logger.warning(
                    "adaptive_gate: the %s callable raised %s; the requests it raises for count as unclassified "
                    "(logged once)",
                    what,
                    type(error).__name__,
                    exc_info=True,
                )
            return None

    def _wrong(self, what: str, value: object, wanted: str) -> None:
        """A callable answered `value`, not `wanted`: said once (a header's value is read as a number or a name,
        never wrong: a client's, never said)."""
        if what in self._warned:
            return
        self._warned.add(what)
        logger.warning(
            "adaptive_gate: the %s callable answered %r, not %s or None; such requests count as unclassified "
            "(logged once)",
            what,
            value,
            wanted,
        )


def _whole(value: object) -> int | None:
    """`value` as an int where it is a whole number (a numpy integer, 3.0), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    number = float(value)
    return int(number) if number.is_integer() else None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None
