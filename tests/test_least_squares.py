"""The line fitted to the readings on and above it (`fit_above`): readings that caught requests before
they allocated lie below the line and are set aside; nothing above it is."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_gate._control.least_squares import MIN_KEPT, distinct, fit_above, least_squares

GiB = 1 << 30


def fit(
    rows: list[list[float]],
    used: list[float],
    tolerance: Callable[[list[float]], float],
    varies: Callable[[list[list[float]]], bool],
) -> list[float] | None:
    """`fit_above` of each reading once, as the gate's fits call it."""
    return fit_above(*distinct(rows, used), tolerance, varies)


def tenth_of_lightest(solution: list[float]) -> float:
    return 0.1 * min(solution)


def both_vary(rows: list[list[float]]) -> bool:
    return all(len({row[c] for row in rows}) >= 3 for c in range(2))


def late_readings(
    bytes_per_request: tuple[float, float], allocated_share: float, seed: int
) -> tuple[list[list[float]], list[float]]:
    """100 readings of up to six requests of each of two kinds in flight, each allocated at a reading
    with probability `allocated_share` (an input decoded first holds nothing yet)."""
    rng = random.Random(seed)
    rows: list[list[float]] = []
    used: list[float] = []
    for _ in range(100):
        in_flight = [rng.randint(0, 6), rng.randint(0, 6)]
        held = [sum(rng.random() < allocated_share for _ in range(n)) for n in in_flight]
        rows.append([float(n) for n in in_flight])
        used.append(sum(b * n for b, n in zip(bytes_per_request, held, strict=True)))
    return rows, used


def test_readings_of_requests_caught_before_they_allocate_are_set_aside() -> None:
    rows, used = late_readings((1.5 * GiB, 6 * GiB), 0.8, seed=3)
    everything = least_squares(rows, used)
    assert everything is not None and everything[1] < 0.9 * 6 * GiB  # all of them: the large ones' bytes read short
    solution = fit(rows, used, tenth_of_lightest, both_vary)
    assert solution == pytest.approx([1.5 * GiB, 6 * GiB], rel=1e-3)


def test_a_reading_above_the_line_is_never_set_aside_and_no_line_explains_it() -> None:
    """A rise that the others' bytes did not count (a neighbour inside the window) lies above every line of
    our requests: the fit refuses rather than bend to it."""
    rows, used = late_readings((1.5 * GiB, 6 * GiB), 1.0, seed=4)
    assert fit(rows, used, tenth_of_lightest, both_vary) == pytest.approx([1.5 * GiB, 6 * GiB])
    used[40:] = [y + 3 * GiB for y in used[40:]]
    assert fit(rows, used, tenth_of_lightest, both_vary) is None


def test_too_few_readings_on_the_line_or_columns_that_never_vary_tell_nothing() -> None:
    rows, used = late_readings((1.5 * GiB, 6 * GiB), 1.0, seed=5)
    assert fit(rows[: MIN_KEPT - 1], used[: MIN_KEPT - 1], tenth_of_lightest, both_vary) is None
    assert fit(rows, used, tenth_of_lightest, lambda _: False) is None
    # Readings that repeat count once: 20 of one state are one reading, not 20.
    assert fit([[1.0, 1.0]] * 20, [7.5 * GiB] * 20, tenth_of_lightest, lambda _: True) is None
    assert distinct([[1.0, 1.0]] * 20, [7.5 * GiB + 1000] * 20) == ([[1.0, 1.0]], [7.5 * GiB])


@settings(max_examples=150, deadline=None)
@given(
    small=st.floats(0.05, 4.0),
    ratio=st.floats(1.0, 12.0),
    allocated_share=st.floats(0.5, 1.0),
    seed=st.integers(0, 2**16),
)
def test_a_line_found_is_the_bytes_of_the_requests_that_held_them(
    small: float, ratio: float, allocated_share: float, seed: int
) -> None:
    """Whatever the sizes and however many requests were caught before they allocated: the line is the
    requests' bytes, or there is none (too few readings caught them all allocated)."""
    truth = (small * GiB, small * ratio * GiB)
    rows, used = late_readings(truth, allocated_share, seed)
    solution = fit(rows, used, tenth_of_lightest, both_vary)
    if solution is not None:
        assert solution == pytest.approx(list(truth), rel=0.02)
    if allocated_share == 1.0:
        assert solution is not None


def test_no_more_readings_than_routes_tell_no_line_and_raise_nothing() -> None:
    """Eight routes and eight distinct readings on their line: a line fits them exactly whatever their noise,
    and no term's error can be told (it divides by the readings beyond the terms: none)."""
    truth = [float(c + 1) * GiB for c in range(8)]
    rows = [[float(r == c) + 1.0 for c in range(8)] for r in range(8)]
    used = [sum(b * n for b, n in zip(truth, row, strict=True)) for row in rows]
    assert fit(rows, used, tenth_of_lightest, lambda _: True) is None
    rows.append([2.0] * 8)
    used.append(sum(2.0 * b for b in truth))
    assert fit(rows, used, tenth_of_lightest, lambda _: True) == pytest.approx(truth)  # one more: the line
