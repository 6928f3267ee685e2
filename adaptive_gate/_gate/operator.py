"""Limits an operator sets at run time through `PUT /gate/limits`: a pin, or tighter or wider bounds.

The controller keeps learning underneath; the gate clamps its answer into the operator's bounds.
A pin is bounds of one value. `{"pin": null}` gives the bounds back to the configuration.

    {"pin": 4}                          run exactly 4 at once
    {"min_limit": 2, "max_limit": 8}    stay within [2, 8] (either key alone keeps the other as configured; a
                                        max_limit above the configured one is refused: the controller
                                        learns within that, and only a pin goes past it)
    {"pin": null}                       back to the configured bounds
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HARD_MAX_LIMIT", "LimitsError", "OperatorBounds", "parse_limits"]

HARD_MAX_LIMIT = 4096
KEYS = ("pin", "min_limit", "max_limit")


class LimitsError(ValueError):
    """A `PUT /gate/limits` body that makes no sense: answered 422, nothing changed."""


@dataclass(frozen=True)
class OperatorBounds:
    min_limit: int
    max_limit: int

    @property
    def pinned(self) -> bool:
        return self.min_limit == self.max_limit

    def clamp(self, limit: int) -> int:
        return max(self.min_limit, min(self.max_limit, limit))

    def describe(self) -> dict[str, int | bool]:
        return {"min_limit": self.min_limit, "max_limit": self.max_limit, "pinned": self.pinned}


def _limit(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitsError(f"{name} must be a whole number, got {value!r}")
    if not 1 <= value <= HARD_MAX_LIMIT:
        raise LimitsError(f"{name} must be in [1, {HARD_MAX_LIMIT}], got {value}")
    return value


def parse_limits(body: object, *, configured_min: int, configured_max: int) -> OperatorBounds | None:
    """The bounds a body asks for (None: the configured ones), or LimitsError saying what is wrong."""
    if not isinstance(body, dict):
        raise LimitsError(f'the body must be a JSON object such as {{"pin": 4}}, got {type(body).__name__}')
    unknown = sorted(set(body) - set(KEYS))
    if unknown:
        raise LimitsError(f"unknown keys {unknown}; allowed: {', '.join(KEYS)}")
    if not body:
        raise LimitsError('nothing to change: send {"pin": N}, {"min_limit": a, "max_limit": b} or {"pin": null}')
    if "pin" in body:
        if len(body) > 1:
            raise LimitsError("pin cannot be combined with min_limit or max_limit")
        if body["pin"] is None:
            return None
        pin = _limit("pin", body["pin"])
        return OperatorBounds(pin, pin)
    low = _limit("min_limit", body["min_limit"]) if "min_limit" in body else configured_min
    high = _limit("max_limit", body["max_limit"]) if "max_limit" in body else configured_max
    if high > configured_max:
        # The controller learns within the configured bounds: wider bounds would change nothing
        raise LimitsError(
            f"max_limit {high} is above the configured max_limit {configured_max}, which the controller learns "
            f'within: restart with a larger max_limit, or pin the limit ({{"pin": {high}}})'
        )
    if low > high:
        raise LimitsError(f"min_limit {low} is above max_limit {high}")
    return OperatorBounds(low, high)
