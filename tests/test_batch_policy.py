"""The batch-size policy (`_batch/policy.py`): bytes per item, the room, the knee, OOM holds. No clocks."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import given

from adaptive_gate._batch.policy import BatchPolicy, ItemBytes, Knee

MiB = 2**20
GiB = 2**30


@given(
    workspace=st.integers(0, 2 * GiB),
    per_unit=st.integers(MiB, GiB),
    sizes=st.lists(st.integers(1, 64), min_size=2, max_size=16),
)
def test_item_bytes_fits_workspace_and_per_unit_exactly_when_sizes_vary(
    workspace: int, per_unit: int, sizes: list[int]
) -> None:
    learner = ItemBytes()
    for n in sizes:
        learner.observe(n, workspace + n * per_unit)
    estimate = learner.estimate()
    assert estimate is not None
    if len(set(sizes)) > 1:
        assert math.isclose(estimate[0], workspace, rel_tol=1e-6, abs_tol=1024)
        assert math.isclose(estimate[1], per_unit, rel_tol=1e-6)
    else:  # one size: the workspace is shared out, so a batch of that size is predicted exactly
        assert estimate[0] == 0.0
        assert math.isclose(estimate[1] * sizes[0], workspace + sizes[0] * per_unit, rel_tol=1e-9)


@pytest.mark.parametrize("scale", [1e-9, 1e200])
def test_item_bytes_fit_whatever_the_scale_of_the_units(scale: float) -> None:
    learner = ItemBytes()
    for n in (1, 2, 3):
        learner.observe(n * scale, GiB + n * MiB)
    estimate = learner.estimate()
    assert estimate is not None and all(math.isfinite(x) for x in estimate)
    assert math.isclose(estimate[0], GiB, rel_tol=1e-6) and math.isclose(estimate[1] * scale, MiB, rel_tol=1e-6)


@given(
    total=st.integers(4 * GiB, 80 * GiB),
    used_fraction=st.floats(0.0, 0.9),
    workspace=st.integers(0, 512 * MiB),
    per_unit=st.integers(MiB, 512 * MiB),
    sizes=st.lists(st.integers(1, 32), min_size=2, max_size=8),
)
def test_the_memory_bound_never_exceeds_the_room_under_target(
    total: int, used_fraction: float, workspace: int, per_unit: int, sizes: list[int]
) -> None:
    policy = BatchPolicy(target_utilisation=0.9)
    used = int(total * used_fraction)
    for n in sizes:
        policy.reading(0.0, used, total)
        policy.batch_done(0.0, items=n, units=n, latency_s=0.1, peak_used_bytes=used + workspace + n * per_unit)
    units = policy.limits().units
    n = math.floor(units)
    if n >= 1 and len(set(sizes)) > 1:
        assert used + workspace + n * per_unit <= 0.9 * total * (1 + 1e-9)
        assert used + workspace + (n + 1) * per_unit > 0.9 * total * (1 - 1e-9)


def test_one_batch_size_that_fit_with_room_to_spare_lets_the_next_batch_be_larger() -> None:
    # A batch holds a 1000 MiB workspace plus 100 MiB per item; 1745.6 MiB of room under target: 7 fit.
    policy = BatchPolicy()
    policy.reading(0.0, 200 * MiB, 2 * GiB)
    for t in range(3):
        policy.batch_done(float(t), items=1, units=1, latency_s=0.01, peak_used_bytes=200 * MiB + 1100 * MiB)
    assert policy.limits().units >= 2, "all the bytes charged to the item: stuck at one for good"
    for t in range(3, 6):
        policy.batch_done(float(t), items=2, units=2, latency_s=0.01, peak_used_bytes=200 * MiB + 1200 * MiB)
    assert 7 <= policy.limits().units < 8


def test_a_neighbour_arriving_and_leaving_moves_the_bound_at_the_next_reading() -> None:
    policy = BatchPolicy(target_utilisation=1.0)
    for n in (1, 2, 3, 4):
        policy.reading(0.0, 2 * GiB, 10 * GiB)
        policy.batch_done(0.0, items=n, units=n, latency_s=0.1, peak_used_bytes=2 * GiB + GiB // 2 + n * GiB // 2)
    assert math.floor(policy.limits().units) == 15
    policy.reading(1.0, 6 * GiB, 10 * GiB)
    assert math.floor(policy.limits().units) == 7
    policy.reading(2.0, 2 * GiB, 10 * GiB)
    assert math.floor(policy.limits().units) == 15


def test_an_oom_holds_the_size_below_it_until_the_hold_ends() -> None:
    policy = BatchPolicy(max_batch_size=64, oom_hold_s=10.0)
    policy.batch_oom(5.0, units=8)
    limits = policy.limits()
    assert limits.bound == "oom" and limits.units < 8 and math.floor(limits.units) == 7
    policy.reading(14.0, GiB, 10 * GiB)
    assert policy.limits().units < 8
    policy.reading(15.0, GiB, 10 * GiB)
    assert policy.limits().units == math.inf


def test_an_oom_the_estimate_did_not_foresee_raises_the_bytes_per_item() -> None:
    policy = BatchPolicy(target_utilisation=1.0)
    policy.reading(0.0, GiB, 10 * GiB)
    policy.batch_done(0.0, items=1, units=1, latency_s=0.1, peak_used_bytes=GiB + 100 * MiB)
    assert math.floor(policy.limits().units) == 92
    policy.batch_oom(1.0, units=30)  # 30 items did not fit in 9 GiB: each takes more than 307 MiB
    estimate = policy.bytes.estimate()
    assert estimate is not None and estimate[1] > 9 * GiB / 30


def throughput_run(knee: Knee, seconds: object, batches: int = 400) -> list[int]:
    """Feed the knee full batches at the size it allows; the sizes it allowed, in order."""
    allowed = []
    for _ in range(batches):
        n = knee.max_items()
        allowed.append(n)
        knee.observe(n, n, seconds(n))  # type: ignore[operator]
    return allowed


def test_the_knee_climbs_where_batching_pays() -> None:
    knee = Knee(min_gain=0.05)
    allowed = throughput_run(knee, lambda n: 0.020 + 0.001 * n)
    assert allowed[-1] >= 63  # a + b*n with a large a: every doubling pays up to ~40 items


def test_the_knee_stays_small_where_batching_does_not_pay() -> None:
    # The 2-core CPU with ResNet-50: 15.5 img/s alone, 14.2 in fours, 10.2 in eights.
    per_image_s = {1: 1 / 15.5, 2: 1 / 15.0, 3: 1 / 14.6, 4: 1 / 14.2, 5: 1 / 13.0, 6: 1 / 12.0, 7: 1 / 11.0}
    knee = Knee(min_gain=0.05)
    allowed = throughput_run(knee, lambda n: n * per_image_s.get(n, 1 / 10.2))
    assert max(allowed) <= 3  # trials of two or three now and then, never kept
    assert sum(1 for n in allowed if n == 1) > 0.8 * len(allowed)


def test_the_knee_steps_down_when_a_smaller_group_became_faster() -> None:
    knee = Knee(min_gain=0.05)
    throughput_run(knee, lambda n: 0.020 + 0.001 * n, batches=60)
    high = knee.group
    assert high >= 2
    for _ in range(5):
        knee.observe(2 ** (high - 1), 2 ** (high - 1), 0.001)  # the card got fast for smaller batches
        knee.observe(2**high, 2**high, 1.0)
    assert knee.group < high


@given(st.lists(st.tuples(st.integers(1, 100), st.floats(0.0, 10.0)), max_size=200))
def test_the_knee_always_allows_at_least_one_item(batches: list[tuple[int, float]]) -> None:
    knee = Knee(min_gain=0.05)
    for n, latency_s in batches:
        knee.observe(n, n, latency_s)
        assert knee.max_items() >= 1
        assert knee.max_items() == 2 ** (knee.group + 1 + knee.trial) - 1


def test_trials_that_do_not_pay_come_ever_more_rarely() -> None:
    knee = Knee(min_gain=0.05)
    allowed = throughput_run(knee, lambda n: 0.065 * n, batches=4000)  # batching never pays
    early, late = allowed[:800], allowed[-800:]
    assert sum(n > 1 for n in late) < sum(n > 1 for n in early)
    assert sum(n > 1 for n in late) <= 0.01 * len(late)
