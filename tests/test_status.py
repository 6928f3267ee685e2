"""The status's bounded windows: percentiles and a mean that follow values as they come and go."""

from __future__ import annotations

from adaptive_gate.status import RecentValues, percentiles_ms


def test_mean_follows_the_window_as_old_values_leave() -> None:
    window = RecentValues(size=4)
    assert window.mean() is None and window.percentiles_ms() is None
    for value in [10.0, 1.0, 1.0, 1.0, 1.0]:
        window.add(value)
    assert window.mean() == 1.0  # the 10 has left the window
    window.add(5.0)
    assert window.mean() == 2.0 and len(window) == 4


def test_nearest_rank_percentiles_in_ms() -> None:
    assert percentiles_ms([i / 1000 for i in range(1, 101)]) == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
