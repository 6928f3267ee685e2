"""Least squares for the fits of the card's readings: the normal equations, their standard errors, and
a line fitted to the readings on and above it.

A reading of the card's used bytes counts every request in flight, but a request admitted a moment ago
may not have allocated yet (an input decoded on the CPU first), and one that failed holds nothing: such
a reading lies below the line of bytes per request, never above it (a neighbour's rise is the memory
model's to tell). `fit_above` sets those readings aside, one pass at a time, down to the readings of
requests that all held their bytes, and accepts the line only where they tell each term to a tenth.
Arithmetic on observations, small enough (two to nine terms) to solve by hand: the simulator replays it
exactly, and the core needs no numerical library.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["LINE_TOLERANCE", "READING_GRAIN_BYTES", "distinct", "dot", "fit_above", "least_squares", "relative_errors"]

MIN_KEPT = 8  # readings that differ, left on the line, before a line is believed
KNOWN_SHARE = 0.1  # how well the readings left must tell each term: its standard error, as a share of it
LINE_TOLERANCE = 0.1  # a reading within this share of the lightest request's bytes of the line lies on it
# Readings closer than this are one: float arithmetic on byte counts strays by fractions of a byte, and
# an allocator hands out blocks, not bytes (a model read exactly at a reading must not read a fall there).
READING_GRAIN_BYTES = 2**20


def distinct(rows: Sequence[Sequence[float]], used_bytes: Sequence[float]) -> tuple[list[list[float]], list[float]]:
    """Each reading once, in the order they came, its bytes to `READING_GRAIN_BYTES`: a gate held in one state
    reads the same again and again, and those add only weight to a fit (at four such points, three of them
    requests caught before they allocated, a line through them all weighed a request told 0.8 at 1.1)."""
    readings = zip(rows, used_bytes, strict=True)
    points = list(dict.fromkeys((tuple(row), round(y / READING_GRAIN_BYTES)) for row, y in readings))
    return [list(row) for row, _ in points], [float(grains * READING_GRAIN_BYTES) for _, grains in points]


def fit_above(
    rows: list[list[float]],
    used_bytes: list[float],
    tolerance: Callable[[list[float]], float],
    varies: Callable[[list[list[float]]], bool],
) -> list[float] | None:
    """The least-squares solution of `used_bytes ~ rows` (no intercept; each reading once: `distinct`) fitted
    to the readings that lie no further than `tolerance(solution)` below it, where every one of those lies
    within that of it, each term is positive and known to `KNOWN_SHARE`, and `varies(rows left)` holds (the
    columns varied enough to be told apart) for `MIN_KEPT` readings at least. None where no line explains
    the readings so."""
    kept_rows, kept_used = rows, used_bytes
    while len(kept_rows) >= MIN_KEPT and varies(kept_rows):
        solution = least_squares(kept_rows, kept_used)
        if solution is None:
            return None
        allowed = tolerance(solution)
        if allowed <= 0:
            return None  # a term not positive: every request holds some bytes, so no line of them
        residuals = [y - dot(x, solution) for x, y in zip(kept_rows, kept_used, strict=True)]
        on_or_above = [i for i, r in enumerate(residuals) if r >= -allowed]
        if len(on_or_above) == len(kept_rows):
            if max(residuals) > allowed or min(solution) <= 0:
                return None
            errors = relative_errors(kept_rows, residuals, solution)
            return solution if errors is not None and max(errors) <= KNOWN_SHARE else None
        kept_rows = [kept_rows[i] for i in on_or_above]
        kept_used = [kept_used[i] for i in on_or_above]
    return None


def relative_errors(design: list[list[float]], residuals: list[float], solution: list[float]) -> list[float] | None:
    """Each term's standard error as a share of it, from the fit's `residuals` (more readings than terms,
    every term positive); None where the columns cannot be told apart, or there are no more readings than terms."""
    n, p = len(design), len(design[0])
    if n <= p:
        return None
    variance = sum(r * r for r in residuals) / (n - p)
    normal = _normal(design)
    errors = []
    for i in range(p):
        column = _solve(normal, [float(i == j) for j in range(p)])  # of the inverse: the solution's covariance
        if column is None:
            return None
        errors.append(math.sqrt(variance * max(0.0, column[i])) / solution[i])
    return errors


def least_squares(design: list[list[float]], y: list[float]) -> list[float] | None:
    """Solve the normal equations; None when the columns are (nearly) dependent: two routes always
    in flight together cannot be told apart."""
    return _solve(_normal(design), [dot([row[i] for row in design], y) for i in range(len(design[0]))])


def dot(a: Sequence[float], b: Sequence[float]) -> float:
    """The sum of the products of `a` and `b`, term by term."""
    return sum(x * y for x, y in zip(a, b, strict=True))


def _normal(design: list[list[float]]) -> list[list[float]]:
    columns = [[row[i] for row in design] for i in range(len(design[0]))]
    return [[dot(a, b) for b in columns] for a in columns]


def _solve(normal: list[list[float]], b: list[float]) -> list[float] | None:
    """`normal` x = `b` by Gaussian elimination with partial pivoting (on copies); None where singular."""
    n = len(b)
    a, b = [row[:] for row in normal], b[:]
    scale = max(abs(a[i][i]) for i in range(n))
    for k in range(n):
        pivot = max(range(k, n), key=lambda i: abs(a[i][k]))
        if abs(a[pivot][k]) <= 1e-9 * scale:
            return None
        a[k], a[pivot], b[k], b[pivot] = a[pivot], a[k], b[pivot], b[k]
        for i in range(k + 1, n):
            factor = a[i][k] / a[k][k]
            for j in range(k, n):
                a[i][j] -= factor * a[k][j]
            b[i] -= factor * b[k]
    solution = [0.0] * n
    for k in reversed(range(n)):
        solution[k] = (b[k] - sum(a[k][j] * solution[j] for j in range(k + 1, n))) / a[k][k]
    return solution if all(math.isfinite(v) for v in solution) else None
