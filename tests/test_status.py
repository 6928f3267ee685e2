"""The status's bounded windows (percentiles and a mean that follow values as they come and go) and histograms."""

from __future__ import annotations

import pytest

from adaptive_gate.status import BucketCounts, RecentValues, percentiles_ms


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


def test_bucket_counts_follow_prometheus_le_semantics() -> None:
    counts = BucketCounts((0.1, 0.5, 1.0))
    for value_s in (0.05, 0.1, 0.3, 0.5, 2.0, 7.0):
        counts.observe(value_s)
    # le is inclusive: 0.1 falls in the 0.1 bucket; counts are cumulative; +Inf holds everything.
    assert counts.cumulative() == [("0.1", 2), ("0.5", 4), ("1.0", 4), ("+Inf", 6)]
    assert counts.sum_s == pytest.approx(9.95)
