"""`python -m benchmarks.virtual`: the scenarios on virtual time, through the gate's own core.

The same scenarios as `python -m benchmarks`, replayed by `adaptive_gate.simulation` (the core the
middleware drives, a simulated card, Poisson arrivals) instead of real clients and threads: minutes
of traffic in a second, the same seed giving the same run. So it can run long phases and many
policies, and its ranks are exact rather than noisy. Policies: static-N (`Fixed(N)`), the oracle
(a limit set to what fits the very moment the card changes), and adaptive (the default `AIMD`).
Where sizes are drawn, the oracle is a byte budget that knows each request's size.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adaptive_gate.control import AIMD, Controller, Fixed
from adaptive_gate.simulation import Phase, SimulationResult, simulate
from adaptive_gate.status import percentiles_ms

from .harness import OOM_AFTER_FRACTION, GiB, Scenario
from .scenarios import FULL_PLAN, LOADS, SCENARIOS, oracle_limits

STATICS = [1, 2, 3, 4, 5, 6]
DEADLINE_S = 5.0


class Oracle(Fixed):
    """A controller that knows the future: `limits` as (from second, limit), applied on the tick the
    simulator gives when the card changes; deaf to everything else, as `Fixed` is."""

    def __init__(self, limits: list[tuple[float, int]]) -> None:
        super().__init__(limits[0][1])
        self.limits = limits

    @property
    def reason(self) -> str:
        return "oracle"

    def on_tick(self, *, now_s: float) -> None:
        self._limit = self._clamp([limit for at_s, limit in self.limits if at_s <= now_s + 1e-9][-1])

    def describe(self) -> dict[str, Any]:
        return {"controller": "oracle", "bound": "controller"}


@dataclass
class Row:
    policy: str
    goodput_per_s: float
    ooms: int
    timed_out: int
    p99_ms: float | None


def phases_of(
    scenario: Scenario, rate_per_s: float, duration_s: float, cost: Callable[[int], float] | None
) -> list[Phase]:
    """The scenario's phases in seconds, where requests weigh what `cost` says (None: 1 each)."""
    return [
        Phase(
            p.at_fraction * duration_s,
            rate_per_s,
            p.request_bytes,
            scenario.work_s,
            p.neighbour_bytes,
            p.neighbour_step_bytes,
            cost,
            scenario.route,
        )  # fmt: skip
        for p in scenario.phases
    ]


def one_run(
    scenario: Scenario,
    controller: Controller,
    rate_per_s: float,
    duration_s: float,
    seed: int,
    cost: Callable[[int], float] | None = None,
) -> SimulationResult:
    return simulate(
        phases_of(scenario, rate_per_s, duration_s, cost),
        total_bytes=scenario.total_bytes,
        baseline_bytes=scenario.weights_bytes,
        duration_s=duration_s,
        controller=controller,
        queue_timeout_s=DEADLINE_S,
        knee=scenario.knee,
        seed=seed,
        oom_after_fraction=OOM_AFTER_FRACTION,
    )


def row(policy: str, result: SimulationResult) -> Row:
    in_time = [latency_s for latency_s in result.latencies_s if latency_s <= DEADLINE_S]
    percentiles = percentiles_ms(in_time)
    p99_ms = None if percentiles is None else percentiles["p99"]
    return Row(policy, round(len(in_time) / result.duration_s, 2), result.ooms, result.timed_out, p99_ms)


def compare(name: str, load: str, duration_s: float, seed: int = 1) -> list[Row]:
    scenario = SCENARIOS[name]
    multiple, clients = LOADS[load]
    if multiple is None:
        raise ValueError(f"virtual time runs open loops only, not {load}")
    rate_per_s = multiple * scenario.capacity_per_s
    rows = [row(f"static-{n}", one_run(scenario, Fixed(n), rate_per_s, duration_s, seed)) for n in STATICS]
    limits = oracle_limits(scenario)
    if limits is None:
        # Drawn sizes: a byte budget that knows each one, counted in GiB, with the card's whole room.
        room_gib = (scenario.total_bytes - scenario.weights_bytes) // GiB
        oracle = one_run(scenario, Fixed(room_gib), rate_per_s, duration_s, seed, cost=lambda nbytes: nbytes / GiB)
    else:
        oracle = one_run(scenario, Oracle([(at * duration_s, n) for at, n in limits]), rate_per_s, duration_s, seed)
    rows.append(row("oracle", oracle))
    rows.append(row("adaptive", one_run(scenario, AIMD(), rate_per_s, duration_s, seed, cost=scenario.cost)))
    return rows


# The full plan's open loops, for the scenarios the simulator models (not a worker killed by an
# OOM, not a service without a lifespan).
PLAN = {
    name: [load for load in loads if LOADS[load][0] is not None]
    for name, loads in FULL_PLAN.items()
    if not SCENARIOS[name].crash_on_oom and SCENARIOS[name].lifespan
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.virtual", description=__doc__)
    parser.add_argument("--duration", type=float, default=120.0, help="virtual seconds per run (default 120)")
    parser.add_argument("--only", action="append", choices=sorted(PLAN), help="run only these scenarios")
    args = parser.parse_args()
    for name, loads in PLAN.items():
        if args.only and name not in args.only:
            continue
        for load in loads:
            rows = compare(name, load, args.duration)
            by_policy = {r.policy: r for r in rows}
            oracle, adaptive = by_policy["oracle"], by_policy["adaptive"]
            best = max((r for r in rows if r.policy.startswith("static-")), key=lambda r: r.goodput_per_s)
            print(
                f"{name:16} {load:5} adaptive {adaptive.goodput_per_s:6.2f}/s ooms {adaptive.ooms:3}  "
                f"oracle {oracle.goodput_per_s:6.2f} ({adaptive.goodput_per_s / oracle.goodput_per_s:.2f}x)  "
                f"best {best.policy} {best.goodput_per_s:6.2f} ({adaptive.goodput_per_s / best.goodput_per_s:.2f}x)  "
                f"oracle / best static {oracle.goodput_per_s / best.goodput_per_s:.2f}x"
            )


if __name__ == "__main__":
    main()
