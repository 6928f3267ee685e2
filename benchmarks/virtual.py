"""`python -m benchmarks.virtual`: the scenarios on virtual time, through the gate's own core.

The same scenarios as `python -m benchmarks`, replayed by `adaptive_gate.simulation` (the core the
middleware drives, a simulated card, Poisson arrivals or a closed loop of clients) instead of real
clients and threads: minutes of traffic in a second, the same seed giving the same run. So it can
run every scenario under every policy, and its ranks are exact rather than noisy. Policies:

* static-N: `Fixed(N)`, the hand-tuned semaphore;
* oracle: a semaphore resized to what fits the very moment the card changes (it knows the future;
  where sizes are drawn, a byte budget that knows each request's size and the card's whole room);
* reader: a byte budget resized from each memory reading at the gate's sample period, knowing each
  request's exact bytes (the others' bytes are the reading less those in flight): the best any gate
  that reads the card can do;
* adaptive: the default `AIMD`, told nothing (in mixed-cost, what each request weighs).

Where the card changes, an OOM takes the worker down for the scenario's `crash_s`. Every row gives
adaptive against the reader, the oracle and the best static-N, and for a neighbour that leaves, how
long the limit took to reach the new fit.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adaptive_gate.control import AIMD, Controller, Fixed
from adaptive_gate.memory import MemorySample
from adaptive_gate.simulation import Phase, SimulationResult, simulate
from adaptive_gate.status import percentiles_ms
from adaptive_gate.testing import SimulatedGPU

from .environment import environment
from .harness import OOM_AFTER_FRACTION, GiB, Scenario
from .scenarios import LOADS as ALL_LOADS
from .scenarios import SCENARIOS, Size, oracle_limits

STATICS = [1, 2, 3, 4, 5, 6]
DEADLINE_S = 5.0
LOADS = {"2x": (2.0, None), "closed-32": (None, 32)}  # open loop at twice the capacity; 32 clients
RESULTS = Path(__file__).parent / "results" / "virtual.json"


def in_gib(nbytes: int) -> float:
    """What a request weighs to a byte budget counted in GiB: rounded up to the 64th the gate counts
    costs in (to the nearest, five requests a byte budget let in at an exact fit ran out of memory)."""
    return math.ceil(nbytes / GiB * 64) / 64


def in_whole_gib(scenario: Scenario) -> int:
    """The most a byte budget counted in GiB may be on the scenario's card: all of it."""
    return max(64, math.ceil(scenario.total_bytes / GiB))


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


class ByteBudget(Fixed):
    """A byte budget of `room_gib` GiB (requests weigh their size, `in_gib`), to the byte: its limit
    is the whole GiB, its budget the part of one beyond (floored, it left a request of the fit out
    on a small card)."""

    def __init__(self, room_gib: float) -> None:
        super().__init__(max(1, math.floor(room_gib + 1e-9)))
        self.room_gib = room_gib

    @property
    def budget(self) -> float:
        return max(float(self._limit), self.room_gib)


class Reader(ByteBudget):
    """A byte budget resized at each reading to the room the card has beside the others' bytes: the
    reading less the exact bytes our requests hold then (the weights and what the neighbour holds,
    read off the simulated card)."""

    def __init__(self, gpu: SimulatedGPU, weights_bytes: int) -> None:
        super().__init__(1.0)
        self.gpu, self.weights_bytes = gpu, weights_bytes

    @property
    def reason(self) -> str:
        return "reader"

    def on_sample(self, *, now_s: float, sample: MemorySample, in_flight: float) -> None:
        others_bytes = self.weights_bytes + self.gpu.neighbour_bytes
        self.room_gib = (sample.total_bytes - others_bytes) / GiB
        self._limit = self._clamp(math.floor(self.room_gib + 1e-9))

    def describe(self) -> dict[str, Any]:
        return {"controller": "reader", "bound": "controller"}


@dataclass
class Row:
    policy: str
    goodput_per_s: float
    ooms: int
    timed_out: int
    p99_ms: float | None
    recovery_s: float | None = None  # after a neighbour left: until the limit reached the new fit
    too_large: int = 0  # of the OOMs, those of requests that never fit, even alone
    cuts: int = 0  # times the limit went down


def phases_of(
    scenario: Scenario, rate_per_s: float, duration_s: float, cost: Callable[[int], float] | None
) -> list[Phase]:
    """The scenario's phases in seconds, where requests weigh what `cost` says (None: 1 each)."""
    work: float | Callable[[Any], float] = scenario.work if scenario.jitter else scenario.work_s
    return [
        Phase(
            p.at_fraction * duration_s,
            rate_per_s,
            p.request_bytes,
            work,
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
    load: str,
    duration_s: float,
    seed: int,
    cost: Callable[[int], float] | None = None,
    gpu: SimulatedGPU | None = None,
    max_limit: int = 64,
) -> SimulationResult:
    """`max_limit`: the gate's default, 64; a byte budget in GiB passes the card's size (capped at
    64 GiB, a budget on a card of 80 or 141 ran fewer of our requests than fit)."""
    multiple, clients = ALL_LOADS[load]  # the plan's two, or any load the real-time benchmark knows
    rate_per_s = (multiple or 0.0) * scenario.capacity_per_s
    if gpu is None:
        gpu = SimulatedGPU(
            scenario.total_bytes, baseline_bytes=scenario.weights_bytes, fragmentation=scenario.fragmentation, seed=seed
        )
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
        crash_s=scenario.crash_s,
        clients=clients,
        gpu=gpu,
        sample_period_s=scenario.sample_period_s,
        start_delay_s=scenario.start_delay_s,
        max_limit=max_limit,
    )


def reader_run(scenario: Scenario, load: str, duration_s: float, seed: int) -> SimulationResult:
    """The reader on its own card, whose neighbour it reads off."""
    card = SimulatedGPU(
        scenario.total_bytes, baseline_bytes=scenario.weights_bytes, fragmentation=scenario.fragmentation, seed=seed
    )
    reader = Reader(card, scenario.weights_bytes)
    return one_run(scenario, reader, load, duration_s, seed, cost=in_gib, gpu=card, max_limit=in_whole_gib(scenario))


def recovery_s(scenario: Scenario, result: SimulationResult, duration_s: float) -> float | None:
    """Where a neighbour leaves: seconds until the limit (in requests) first reached what fits then
    (the whole rest of the phase where it never did); None where no neighbour leaves."""
    recovered: list[float] = []
    for before, phase in zip(scenario.phases, scenario.phases[1:], strict=False):
        if not (phase.neighbour_bytes < before.neighbour_bytes and isinstance(phase.request_bytes, Size)):
            continue
        fit = (scenario.total_bytes - scenario.weights_bytes - phase.neighbour_bytes) // phase.request_bytes.nbytes
        start_s = phase.at_fraction * duration_s
        reached = [t for t, limit, *_ in result.series if t >= start_s and limit >= fit]
        recovered.append((reached[0] if reached else duration_s) - start_s)
    return max(recovered) if recovered else None


def row(policy: str, result: SimulationResult, recovered_s: float | None = None) -> Row:
    in_time = [latency_s for latency_s in result.latencies_s if latency_s <= DEADLINE_S]
    percentiles = percentiles_ms(in_time)
    p99_ms = None if percentiles is None else percentiles["p99"]
    goodput = round(len(in_time) / result.duration_s, 2)
    recovered = None if recovered_s is None else round(recovered_s, 2)
    cuts = sum(1 for _, old, new, _ in result.limit_changes if new < old)
    return Row(policy, goodput, result.ooms, result.timed_out, p99_ms, recovered, result.too_large, cuts)


def compare(
    name: str, load: str, duration_s: float, seed: int = 1, controller: Callable[[], Controller] = AIMD
) -> list[Row]:
    """Every policy on one scenario and load, in one process: static-1..6, oracle, reader, adaptive
    (`controller()`, the default `AIMD` unless told otherwise: an ablation passes its variant)."""
    scenario = SCENARIOS[name]
    rows = [row(f"static-{n}", one_run(scenario, Fixed(n), load, duration_s, seed)) for n in STATICS]
    limits = oracle_limits(scenario)
    if limits is None:
        # Drawn sizes: a byte budget that knows each one, counted in GiB, with the card's whole room.
        budget = ByteBudget((scenario.total_bytes - scenario.weights_bytes) / GiB)
        oracle = one_run(scenario, budget, load, duration_s, seed, cost=in_gib, max_limit=in_whole_gib(scenario))
    else:
        oracle = one_run(scenario, Oracle([(at * duration_s, n) for at, n in limits]), load, duration_s, seed)
    rows.append(row("oracle", oracle))
    rows.append(row("reader", reader_run(scenario, load, duration_s, seed)))
    adaptive = one_run(scenario, controller(), load, duration_s, seed, cost=scenario.cost)
    rows.append(row("adaptive", adaptive, recovery_s(scenario, adaptive, duration_s)))
    return rows


def summary(rows: list[Row]) -> dict[str, Any]:
    """Adaptive against the reader, the oracle and the best static-N, and the OOMs of both."""
    by_policy = {r.policy: r for r in rows}
    adaptive, reader, oracle = by_policy["adaptive"], by_policy["reader"], by_policy["oracle"]
    best = max((r for r in rows if r.policy.startswith("static-")), key=lambda r: r.goodput_per_s)
    return {
        "adaptive_per_s": adaptive.goodput_per_s,
        "vs_reader": round(adaptive.goodput_per_s / reader.goodput_per_s, 3),
        "vs_oracle": round(adaptive.goodput_per_s / oracle.goodput_per_s, 3),
        "vs_best_static": round(adaptive.goodput_per_s / best.goodput_per_s, 3),
        "best_static": best.policy,
        "adaptive_ooms": adaptive.ooms - adaptive.too_large,
        "reader_ooms": reader.ooms - reader.too_large,
        "too_large": adaptive.too_large,
        "adaptive_cuts": adaptive.cuts,
        "recovery_s": adaptive.recovery_s,
    }


PLAN = {name: list(LOADS) for name, scenario in SCENARIOS.items() if scenario.lifespan}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.virtual", description=__doc__)
    parser.add_argument("--duration", type=float, default=60.0, help="virtual seconds per run (default 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", choices=sorted(PLAN), help="run only these scenarios")
    parser.add_argument("--no-save", action="store_true", help=f"print only; do not write {RESULTS.name}")
    args = parser.parse_args()
    table: list[dict[str, Any]] = []
    for name, loads in PLAN.items():
        if args.only and name not in args.only:
            continue
        for load in loads:
            rows = compare(name, load, args.duration, args.seed)
            figures = summary(rows)
            table.append({"scenario": name, "load": load, **figures, "rows": [asdict(r) for r in rows]})
            print(
                f"{name:16} {load:9} adaptive {figures['adaptive_per_s']:6.2f}/s "
                f"reader {figures['vs_reader']:.3f}x oracle {figures['vs_oracle']:.3f}x "
                f"best {figures['best_static']} {figures['vs_best_static']:.3f}x  "
                f"ooms {figures['adaptive_ooms']} (reader {figures['reader_ooms']}, too large {figures['too_large']})"
                + ("" if figures["recovery_s"] is None else f"  back in {figures['recovery_s']:.2f} s")
            )
    if not args.no_save and not args.only:
        command = f"python -m benchmarks.virtual --duration {args.duration:g} --seed {args.seed}"
        document = {"environment": environment(), "command": command, "duration_s": args.duration, "table": table}
        RESULTS.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
