"""Any card, any load, any change of either, through the gate's own core on virtual time: the gate
never fails, and its limit never leaves the bounds in force.

Drawn far wider than the benchmarks' families: cards of 2 to 141 GiB nearly full of weights or empty,
requests of a few bytes or larger than the room, mixes, routes and `cost`, neighbours that take more
than the room, greedy ones, crashes, closed loops, readings every 20 ms or every second, requests that
allocate late.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive_gate.control import AIMD, MemoryModel
from adaptive_gate.simulation import Phase, simulate

GiB = 2**30


@st.composite
def phases(draw: st.DrawFn, room_bytes: int) -> Phase:
    def size() -> int:
        return max(1, int(room_bytes * draw(st.sampled_from([1e-9, 0.001, 0.05, 0.2, 0.34, 0.9, 1.5]))))

    small, large = size(), size()
    share = draw(st.floats(0.0, 1.0))
    request_bytes: int | object = small
    if draw(st.booleans()):  # a mix the gate cannot tell apart, unless told through a route or `cost`

        def request_bytes(rng: random.Random) -> int:  # type: ignore[misc]
            return large if rng.random() < share else small

    work_s = draw(st.sampled_from([0.005, 0.05, 0.1, 1.0]))
    neighbour_bytes = int(room_bytes * draw(st.sampled_from([0.0, 0.0, 0.3, 0.99, 1.2])))
    cut = max(small, large) - 1
    return Phase(
        draw(st.floats(0.0, 4.0)),
        rate_per_s=draw(st.sampled_from([1.0, 20.0, 200.0])),
        request_bytes=request_bytes,  # type: ignore[arg-type]
        work_s=work_s,
        neighbour_bytes=neighbour_bytes,
        neighbour_step_bytes=draw(st.sampled_from([0, GiB // 2])) if neighbour_bytes else 0,
        cost=(lambda nbytes: min(64.0, max(0.05, nbytes / max(1, small)))) if draw(st.booleans()) else None,
        route=(lambda nbytes: "/large" if nbytes > cut else "/infer") if draw(st.booleans()) else None,
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_limit_stays_within_the_bounds_in_force_whatever_the_card_does(data: st.DataObject) -> None:
    total_bytes = data.draw(st.sampled_from([2, 24, 141])) * GiB
    baseline_bytes = int(total_bytes * data.draw(st.sampled_from([0.0, 0.3, 0.95])))
    drawn = data.draw(st.lists(phases(total_bytes - baseline_bytes), min_size=1, max_size=4))
    drawn[0] = replace(drawn[0], start_s=0.0)  # the first phase starts the run
    min_limit = data.draw(st.integers(1, 3))
    max_limit = min_limit + data.draw(st.sampled_from([0, 3, 60]))
    controller = AIMD(memory=MemoryModel(target_utilisation=data.draw(st.sampled_from([1.0, 0.8]))))
    result = simulate(
        drawn,
        total_bytes=total_bytes,
        baseline_bytes=baseline_bytes,
        duration_s=5.0,
        controller=controller,
        min_limit=min_limit,
        max_limit=max_limit,
        max_queue=data.draw(st.sampled_from([0, 16])),
        queue_timeout_s=data.draw(st.sampled_from([0.05, 5.0])),
        knee=data.draw(st.sampled_from([math.inf, 2.0])),
        sample_period_s=data.draw(st.sampled_from([0.02, 0.1, 1.0])),
        seed=data.draw(st.integers(0, 3)),
        oom_after_fraction=data.draw(st.sampled_from([0.0, 0.3])),
        crash_s=data.draw(st.sampled_from([0.0, 1.0])),
        clients=data.draw(st.sampled_from([None, 1, 40])),
        start_delay_s=data.draw(st.sampled_from([0.0, 0.05])),
    )
    assert result.completed >= 0
    for at_s, old, new, reason in result.limit_changes:
        assert min_limit <= new <= max_limit, (at_s, old, new, reason)
    assert min_limit <= controller.limit <= max_limit
    described = controller.describe()
    assert isinstance(described["why"], str) and described["bound"]
