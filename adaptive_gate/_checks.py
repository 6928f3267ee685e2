"""Checks of configuration values, shared by the gate, the controllers and the diagnostics: each
says what is wrong with a value, and what would be right, before anything runs with it."""

from __future__ import annotations

import math

__all__ = ["check_fraction", "check_int", "check_seconds"]


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_seconds(name: str, value: object, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds, got {value}")
    return float(value)


def check_fraction(name: str, value: float, *, low: float = 0.0, high: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not low < value <= high:
        raise ValueError(f"{name} must be in ({low}, {high}], got {value}")
    return float(value)
