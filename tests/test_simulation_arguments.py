"""`simulate()` and `Phase` say what is wrong with a number that would make no run: an endless or NaN
duration, readings every 0 s (both hung), a NaN rate (it failed deep in the run), a knee of 0 (it divided
by zero), an OOM past the end of a request's work, bounds that leave no limit."""

from __future__ import annotations

import math
from typing import Any

import pytest

from adaptive_gate.simulation import Phase, simulate

GiB = 2**30
CLASSIC = [Phase(0.0, rate_per_s=10, request_bytes=GiB, work_s=0.1)]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"duration_s": math.nan}, ValueError, "duration_s must be a finite number > 0, got nan"),
        ({"duration_s": math.inf}, ValueError, "duration_s must be a finite number > 0"),
        ({"duration_s": 0}, ValueError, "duration_s must be a finite number > 0"),
        ({"sample_period_s": 0}, ValueError, "sample_period_s must be a finite number > 0"),
        ({"sample_period_s": -1}, ValueError, "sample_period_s must be a finite number > 0"),
        ({"sample_period_s": "0.1"}, TypeError, "sample_period_s must be a number"),
        ({"start_delay_s": math.inf}, ValueError, "start_delay_s must be a finite number >= 0"),
        ({"queue_timeout_s": -1}, ValueError, "queue_timeout_s must be >= 0 seconds"),
        ({"queue_timeout_s": math.nan}, ValueError, "queue_timeout_s must be >= 0 seconds"),
        ({"crash_s": -1}, ValueError, "crash_s must be >= 0 seconds"),
        ({"knee": 0}, ValueError, r"knee must be > 0 requests at full speed \(math.inf: no knee\)"),
        ({"knee": math.nan}, ValueError, "knee must be > 0"),
        ({"knee": None}, TypeError, r"knee must be a number of requests at full speed \(math.inf: no knee\)"),
        ({"oom_after_fraction": 2}, ValueError, r"oom_after_fraction must be within \[0, 1\]"),
        ({"oom_after_fraction": -0.5}, ValueError, r"oom_after_fraction must be within \[0, 1\]"),
        ({"clients": 0}, ValueError, "clients .* must be >= 1, got 0"),
        ({"min_limit": 0}, ValueError, "min_limit must be >= 1, got 0"),
        ({"min_limit": 3, "max_limit": 2}, ValueError, "max_limit must be >= 3, got 2"),
        ({"max_limit": 2.5}, TypeError, "max_limit must be an int"),
        ({"initial_limit": 0}, ValueError, r"initial_limit must be in \[1, 64\], got 0"),
        ({"initial_limit": 2.5}, TypeError, "initial_limit must be an int"),
    ],
)
def test_simulate_says_which_number_makes_no_run(options: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        simulate(CLASSIC, **{"total_bytes": 24 * GiB, "baseline_bytes": 8 * GiB, "duration_s": 1.0, **options})


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"rate_per_s": math.nan}, ValueError, "Phase.rate_per_s must be a finite number >= 0, got nan"),
        ({"rate_per_s": -5}, ValueError, "Phase.rate_per_s must be a finite number >= 0"),
        ({"start_s": math.inf}, ValueError, "Phase.start_s must be a finite number >= 0"),
        ({"work_s": -0.1}, ValueError, r"Phase.work_s \(seconds, or a draw \(rng\) -> seconds\) must be"),
        ({"request_bytes": -1}, ValueError, r"Phase.request_bytes must be in \[0, 2\*\*60\], got -1"),
        ({"request_bytes": 1.5}, ValueError, "Phase.request_bytes must be a whole number of bytes"),
        ({"request_bytes": "1GiB"}, TypeError, "Phase.request_bytes must be an int"),
        ({"neighbour_bytes": -5}, ValueError, "Phase.neighbour_bytes must be in"),
        ({"cost": 4}, TypeError, "Phase.cost must be None or a callable"),
    ],
)
def test_a_phase_says_which_of_its_numbers_is_wrong(fields: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Phase(**{"start_s": 0.0, "rate_per_s": 10, "request_bytes": GiB, "work_s": 0.1, **fields})


def test_draws_an_idle_phase_and_bytes_as_floats_are_fine() -> None:
    """Sizes and works drawn per request, a phase with no arrivals, requests of no work, a whole number of
    bytes given as a float (taken as an int, as `MemorySample` takes it): a run."""
    phases = [
        Phase(0.0, rate_per_s=10, request_bytes=lambda rng: GiB, work_s=lambda rng: rng.uniform(0.05, 0.15)),
        Phase(0.5, rate_per_s=0, request_bytes=1.5 * GiB, work_s=0.0),  # type: ignore[arg-type]
    ]
    assert phases[1].request_bytes == 3 * GiB // 2 and isinstance(phases[1].request_bytes, int)
    result = simulate(phases, total_bytes=24 * GiB, baseline_bytes=8 * GiB, duration_s=1.0)
    assert result.completed > 0


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"work_s": lambda rng: math.nan}, ValueError, r"Phase.work_s's draw \(seconds\) must be a finite number >= 0"),
        ({"work_s": lambda rng: -1.0}, ValueError, r"Phase.work_s's draw \(seconds\) must be a finite number >= 0"),
        ({"work_s": lambda rng: math.inf}, ValueError, r"Phase.work_s's draw \(seconds\) must be a finite number"),
        ({"request_bytes": lambda rng: -GiB}, ValueError, r"Phase.request_bytes's draw must be in \[0, 2\*\*60\]"),
        ({"request_bytes": lambda rng: "1GiB"}, TypeError, r"Phase.request_bytes's draw must be an int"),
    ],
)
def test_a_draw_says_what_is_wrong_with_what_it_drew(fields: dict[str, Any], error: type, match: str) -> None:
    """A NaN or negative work drawn ran as no work at all, and an endless one served nothing, silently."""
    phase = Phase(**{"start_s": 0.0, "rate_per_s": 50, "request_bytes": GiB, "work_s": 0.1, **fields})
    with pytest.raises(error, match=match):
        simulate([phase], total_bytes=8 * GiB, baseline_bytes=0, duration_s=1.0)


def test_phases_may_come_in_any_order() -> None:
    later, first = Phase(0.5, 0, GiB, 0.1), Phase(0.0, 20, GiB, 0.1)
    ordered = simulate([first, later], total_bytes=8 * GiB, baseline_bytes=0, duration_s=1.0, seed=3)
    shuffled = simulate([later, first], total_bytes=8 * GiB, baseline_bytes=0, duration_s=1.0, seed=3)
    assert shuffled.completed == ordered.completed > 0
    with pytest.raises(ValueError, match="phases must start with one at start_s=0"):
        simulate([later], total_bytes=8 * GiB, baseline_bytes=0, duration_s=1.0)
