"""`python -m benchmarks.unseen`: the targets on scenarios nobody tuned the controller on.

Each seed draws a card (16 to 80 GiB, a tenth to a half of it weights), a request size (2 to 10
fit; 12 to 40 in the family "many") and what changes: a neighbour that comes and goes (greedy or
not, one or two), inputs that grow or shrink, or a mix of two sizes told through `cost` or on two
routes. The family "readings" draws any of those, and how often the gate reads the card (every
0.05 to 0.5 s), a request's work (0.02 to 1 s) and whether it varies. The family "compound" draws
neighbours of other shapes (one that leaks in steps and then leaves, one that comes and goes again
and again, one that leaves room for no request) and changes that come together (a mix beside a
neighbour, inputs that grow beside one or shrink after it left). The family "late" draws any of the
first, where each request allocates up to a quarter to three times its work after its admission
(its input decoded on the CPU first); the family "units" its mixes told through `cost`, in a unit of cost
that makes no request's cost a whole number; the family "route-costs" its mixes of routes, each route told a
cost in the ratio of their bytes give or take half (from two thirds to one and a half times it); the family
"whole-costs" the same, the cost rounded to a whole number (as `3.0 if ... else 1.0` tells it). It runs the
default gate and the reader side by side on virtual time (arrivals at twice the capacity and 32 clients in a closed
loop, or the `--loads` given), and flags a run that misses a target: below 0.95 of the reader, more
OOMs than the reader's plus one per change of the card (a mix of routes: plus 2% of its answers
while the weights are learnt), or more than a second back to the fit after a neighbour left.

Nothing here is tuned to: the draw is the point. Prints one line a run and the misses at the end; `--suite`
runs every draw the benchmarks page reports and writes `results/unseen.json`, the table there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from adaptive_gate.control import AIMD

from .environment import environment
from .model import GiB, Phase, Scenario, Size
from .scenarios import LOADS as ALL_LOADS
from .virtual import one_run, reader_run, recovery_s, row

NEIGHBOURS = ["neighbour", "greedy", "neighbour2", "growth", "shrink", "classic", "nearly-all"]
# Neighbours of other shapes, and changes that come together.
COMPOUND = ["leak", "flapping", "no-room", "mix-cost-neighbour", "mix-routes-neighbour", "growth-neighbour",
            "neighbour-shrink"]  # fmt: skip
MIXES = ["mix-cost", "mix-routes"]
FAMILIES = {
    "neighbours": NEIGHBOURS,
    "mixes": MIXES,
    "many": NEIGHBOURS,
    "readings": [*NEIGHBOURS, *MIXES],
    "compound": COMPOUND,
    "late": [*NEIGHBOURS, *MIXES],
    "units": ["mix-cost"],
    "route-costs": ["mix-routes-cost"],
    "whole-costs": ["mix-routes-whole"],
}
# What each family draws, for the table of the benchmarks page.
DRAWS = {
    "neighbours": "a neighbour that comes and goes (greedy or not, one or two), inputs that grow or shrink",
    "many": "the changes of `neighbours` on cards that hold 12 to 40 requests",
    "readings": "the changes of `neighbours` and `mixes`, read every 0.05 to 0.5 s, requests of 0.02 to 1 s",
    "compound": "a neighbour that leaks, flaps or leaves no room; a change beside a neighbour",
    "late": "the changes of `readings`, each request allocating up to three times its work after admission",
    "mixes": "two sizes told through `cost` or on two routes",
    "units": "a mix told through `cost` in a unit that makes no cost whole, allocating late",
    "route-costs": "a mix of routes, each told a cost off its bytes' ratio by up to half, allocating late",
    "whole-costs": "`route-costs` with each cost rounded to a whole number",
}
# How many requests the card holds, drawn: a few (the model's usual case), or many small ones ("many": a
# card with room for 12 to 40, where a change meets many requests admitted in the same moment).
FITS = {
    "neighbours": (2, 10), "mixes": (2, 10), "many": (12, 40), "readings": (2, 10), "compound": (3, 10),
    "late": (2, 10), "units": (2, 10), "route-costs": (2, 10), "whole-costs": (2, 10),
}  # fmt: skip
SAMPLE_PERIODS_S = [0.05, 0.1, 0.25, 0.5]  # the family "readings": the gate's `sample_period`
WORKS_S = [0.02, 0.05, 0.1, 0.3, 1.0]
LATE_SHARES = [0.25, 0.5, 1.0, 2.0, 3.0]  # the family "late": the most a request waits to allocate, in works
LOADS = ["2x", "closed-32"]  # by default; `--loads` takes any of `benchmarks.scenarios.LOADS`
DURATION_S = 60.0
TARGETS = ("ratio", "ooms", "recovery")  # what a run may miss: 0.95 of the reader, its OOMs, back within 1 s
RESULTS = Path(__file__).parent / "results" / "unseen.json"
# The draws the benchmarks page reports (`--suite`): family, first seed, seeds, loads.
SUITE: list[tuple[str, int, int, tuple[str, ...]]] = [
    ("neighbours", 0, 130, ("2x", "closed-32")),
    ("neighbours", 0, 130, ("1x", "4x")),
    ("many", 0, 60, ("2x", "closed-32")),
    ("readings", 0, 60, ("2x", "closed-32")),
    *[("readings", first, 40, ("2x", "closed-32")) for first in (5000, 7000, 13000, 17000, 23000)],
    ("readings", 71000, 60, ("2x", "closed-32")),
    ("neighbours", 61000, 60, ("2x", "closed-32")),
    ("compound", 0, 100, ("2x", "closed-32")),
    ("late", 0, 60, ("2x", "closed-32")),
    ("mixes", 100, 60, ("2x", "closed-32")),
    ("mixes", 200, 60, ("2x", "closed-32")),
    ("units", 0, 60, ("2x", "closed-32")),
    ("units", 7000, 60, ("2x", "closed-32")),
    ("route-costs", 0, 60, ("2x", "closed-32")),
    ("whole-costs", 0, 60, ("2x", "closed-32")),
]


def _fitting(room: int, fit: int, rng: random.Random) -> int:
    """A request size of which `fit` fit in `room`, with a random part of one to spare."""
    return int(room / (fit + rng.uniform(0.05, 0.95)))


def _leaving(room: int, size: int, fit: int, rng: random.Random) -> int:
    """A neighbour's bytes that leave room for fewer of `size` than `fit`, and a random part of one more."""
    left = rng.randint(1, max(1, fit - 1))
    return room - int(size * (left + rng.uniform(0.02, 0.98)))


def _two_sizes(small: int, large: int, share: float) -> Callable[[random.Random], int]:
    def draw(rng: random.Random) -> int:
        return large if rng.random() < share else small

    return draw


def of_family(seed: int, family: str) -> Scenario:
    """Seed `seed`'s scenario of the family `family` (a key of `FAMILIES`)."""
    scenario = draw(seed, FAMILIES[family], FITS[family], readings=family == "readings")
    if family == "units":
        scenario = in_other_units(seed, scenario)
    return late(seed, scenario) if family in ("late", "units", "route-costs", "whole-costs") else scenario


def in_other_units(seed: int, scenario: Scenario) -> Scenario:
    """`scenario`, a mix told through `cost`, with a unit of cost drawn from half to twice its small request:
    exact, but no longer whole numbers (a small request weighs 1 in the other families)."""
    unit = random.Random(f"units-{seed}").uniform(0.5, 2.0)
    told = scenario.cost
    assert told is not None, "only a mix told through cost has units"
    return replace(
        scenario,
        description=scenario.description + f", a unit of cost {unit:.2f} small requests",
        cost=lambda nbytes: told(nbytes) / unit,
    )


def late(seed: int, scenario: Scenario) -> Scenario:
    """`scenario` where each request allocates up to a drawn share of its work after its admission."""
    delay_s = random.Random(f"late-{seed}").choice(LATE_SHARES) * scenario.work_s
    return replace(
        scenario,
        description=scenario.description + f", allocates up to {delay_s:g} s after admission",
        start_delay_s=delay_s,
        # A slot is held half the delay longer, on average, than the work
        capacity_per_s=scenario.capacity_per_s * scenario.work_s / (scenario.work_s + delay_s / 2),
    )


def draw(
    seed: int, kinds: list[str], fits: tuple[int, int] = FITS["neighbours"], *, readings: bool = False
) -> Scenario:
    """Seed `seed`'s scenario of one of `kinds`; with `readings`, its sample period and work drawn too."""
    scenario = _draw(seed, kinds, fits)
    if not readings:
        return scenario
    timing = random.Random(f"readings-{seed}")  # drawn apart: the card and its changes are the other families'
    period_s, work_s, jitter = timing.choice(SAMPLE_PERIODS_S), timing.choice(WORKS_S), timing.random() < 0.3
    return replace(
        scenario,
        description=scenario.description.replace(
            f"{scenario.work_s:g} s a request", f"{work_s:g} s a request{' (varies)' if jitter else ''}"
        )
        + f", read every {period_s:g} s",
        work_s=work_s,
        capacity_per_s=scenario.capacity_per_s * scenario.work_s / work_s,
        jitter=jitter,
        sample_period_s=period_s,
    )


def _draw(seed: int, kinds: list[str], fits: tuple[int, int]) -> Scenario:
    rng = random.Random(seed)
    total = rng.choice([16, 24, 40, 48, 80]) * GiB
    weights = int(total * rng.uniform(0.1, 0.5))
    room = total - weights
    kind = rng.choice(kinds)
    work_s = rng.choice([0.05, 0.1, 0.2])
    crash_s = rng.choice([0.0, 1.0])
    fit = rng.randint(*fits)
    size = _fitting(room, fit, rng)
    cost: Callable[[int], float] | None = None
    route: Callable[[int], str] | None = None
    costs = ""  # what the description says of a cost per route
    if kind in ("neighbour", "greedy"):
        neighbour = _leaving(room, size, fit, rng)
        step = GiB // 2 if kind == "greedy" else 0
        phases = [Phase(0.0, Size(size)), Phase(1 / 3, Size(size), neighbour, step), Phase(2 / 3, Size(size))]
    elif kind == "neighbour2":
        first, second = int(room * rng.uniform(0.1, 0.4)), int(room * rng.uniform(0.2, 0.6))
        phases = [
            Phase(0.0, Size(size)),
            Phase(0.25, Size(size), first),
            Phase(0.5, Size(size), second),
            Phase(0.75, Size(size)),
        ]
    elif kind == "nearly-all":  # a neighbour leaves room for one and a half requests
        phases = [Phase(0.0, Size(size)), Phase(1 / 3, Size(size), room - int(size * 1.5)), Phase(2 / 3, Size(size))]
    elif kind == "leak":  # a neighbour that grows in steps over the middle of the run, then leaves
        neighbour = _leaving(room, size, fit, rng)
        steps = rng.choice([5, 10, 20])
        leaking = [Phase(0.2 + 0.5 * i / steps, Size(size), neighbour * (i + 1) // steps) for i in range(steps)]
        phases = [Phase(0.0, Size(size)), *leaking, Phase(0.8, Size(size))]
    elif kind == "flapping":  # a neighbour that comes and goes, again and again
        neighbour = _leaving(room, size, fit, rng)
        flips = rng.choice([4, 6, 10])
        phases = [Phase(i / flips, Size(size), neighbour if i % 2 else 0) for i in range(flips)]
    elif kind == "no-room":  # a neighbour that leaves room for part of one request: none fits
        neighbour = room - int(size * rng.uniform(0.2, 0.9))
        phases = [Phase(0.0, Size(size)), Phase(1 / 3, Size(size), neighbour), Phase(2 / 3, Size(size))]
    elif kind in ("growth-neighbour", "neighbour-shrink"):  # inputs change beside a neighbour, or after it left
        other = _fitting(room, rng.randint(1, max(1, fit - 1)), rng)
        neighbour = int(room * rng.uniform(0.1, 0.4))
        grown, lean = Size(max(size, other)), Size(min(size, other))
        if kind == "growth-neighbour":  # they grow while it stays, and it leaves
            phases = [Phase(0.0, lean), Phase(0.25, lean, neighbour), Phase(0.5, grown, neighbour)]
            phases.append(Phase(0.75, grown))
        else:  # it comes and leaves, and they shrink
            phases = [Phase(0.0, grown), Phase(0.25, grown, neighbour), Phase(0.5, grown), Phase(0.75, lean)]
    elif kind in ("growth", "shrink"):
        other = _fitting(room, rng.randint(1, max(1, fit - 1)), rng)
        before, after = (size, other) if kind == "growth" else (other, size)
        phases = [Phase(0.0, Size(before)), Phase(0.5, Size(after))]
    elif kind.startswith(("mix-cost", "mix-routes")):
        small = int(room / (rng.randint(6, 16) + 0.5))
        large = small * rng.choice([2, 3, 4, 8])
        share = rng.choice([0.1, 0.25, 0.5])
        mix = _two_sizes(small, large, share)
        phases = [Phase(0.0, mix)]
        if kind.endswith("-neighbour"):  # beside a neighbour for the middle third that leaves room for a large one
            neighbour = int(min(room * rng.uniform(0.1, 0.4), room - 2 * large))
            phases = [Phase(0.0, mix), Phase(1 / 3, mix, max(0, neighbour)), Phase(2 / 3, mix)]
        fit = max(1, round(room / (small * (1 - share) + large * share)))
        crash_s = 0.0
        if kind.startswith("mix-cost"):
            cost = lambda nbytes, small=small: nbytes / small  # noqa: E731
        else:
            route = lambda nbytes, small=small: "/infer/large" if nbytes > small else "/infer"  # noqa: E731
        if kind in ("mix-routes-cost", "mix-routes-whole"):  # a cost per route: the bytes' ratio, give or take half
            off = rng.uniform(2 / 3, 3 / 2)
            told = large / small * off
            costs = f", the large route told a cost {off:.2f} times its bytes' ratio"
            if kind == "mix-routes-whole":
                told = max(1, round(told))
                costs = f", the large route told a whole cost of {told:.0f} where it holds {large // small} small ones"
            cost = lambda nbytes, small=small, told=told: told if nbytes > small else 1.0  # noqa: E731
    else:
        phases = [Phase(0.0, Size(size))]
    return Scenario(
        f"{kind}-{seed}",
        f"{total / GiB:.0f} GiB card, {weights / GiB:.1f} GiB of weights, about {fit} fit, "
        f"{work_s:g} s a request, OOMs {'crash for 1 s' if crash_s else 'do not crash'}{costs}",
        phases,
        total_bytes=total,
        weights_bytes=weights,
        work_s=work_s,
        capacity_per_s=min(fit, 6) / work_s,
        crash_s=crash_s,
        cost=cost,
        route=route,
    )


def measured(family: str, seed: int, load: str) -> dict[str, Any]:
    """One run of the gate and the reader on seed `seed`'s draw of `family`: the figures, and the targets missed."""
    scenario = of_family(seed, family)
    adaptive = one_run(scenario, AIMD(), load, DURATION_S, 1, cost=scenario.cost)
    reader = reader_run(scenario, load, DURATION_S, 1)
    ours, theirs = row("adaptive", adaptive, recovery_s(scenario, adaptive, DURATION_S)), row("reader", reader)
    ratio = ours.goodput_per_s / max(theirs.goodput_per_s, 1e-9)
    ooms = ours.ooms - ours.too_large
    allowed: float = theirs.ooms - theirs.too_large + len(scenario.phases) - 1
    if scenario.route is not None:
        allowed += 0.02 * ours.goodput_per_s * DURATION_S
    missed = [
        name
        for name, miss in [
            ("ratio", ratio < 0.95),
            ("ooms", ooms > allowed),
            ("recovery", ours.recovery_s is not None and ours.recovery_s > 1.0),
        ]
        if miss
    ]
    return {
        "scenario": scenario.name, "load": load, "vs_reader": round(ratio, 3), "ooms": ooms,
        "reader_ooms": theirs.ooms - theirs.too_large, "allowed_ooms": round(allowed, 1),
        "recovery_s": ours.recovery_s, "missed": missed, "description": scenario.description,
    }  # fmt: skip


def line(run: dict[str, Any]) -> str:
    """What `main` prints of one run of `measured`."""
    return (
        f"{run['scenario']:16s} {run['load']:9s} {run['vs_reader']:5.2f} of the reader, OOMs {run['ooms']} "
        f"({run['reader_ooms']}), back in {run['recovery_s']} s  {' '.join(run['missed'])}  [{run['description']}]"
    )


def run_draws(
    family: str, first_seed: int, seeds: int, loads: Sequence[str], pool: Executor | None = None
) -> Iterator[dict[str, Any]]:
    """`measured` for each seed and load, in order; on `pool`'s processes where given."""
    draws = [(seed, load) for seed in range(first_seed, first_seed + seeds) for load in loads]
    families, seed_list, load_list = [family] * len(draws), [seed for seed, _ in draws], [load for _, load in draws]
    yield from (pool.map if pool is not None else map)(measured, families, seed_list, load_list)


def summed(
    family: str, first_seed: int, seeds: int, loads: Sequence[str], runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """One line of the suite's table: how many of `runs` missed a target, by which, and the ratios."""
    if not runs:
        raise ValueError(f"no runs of {family} from seed {first_seed} to sum: give at least one seed and one load")
    ratios = sorted(run["vs_reader"] for run in runs)
    return {
        "family": family, "first_seed": first_seed, "seeds": seeds, "loads": list(loads), "runs": len(runs),
        "missed": sum(bool(run["missed"]) for run in runs),
        "missed_by": {target: sum(target in run["missed"] for run in runs) for target in TARGETS},
        "median_vs_reader": statistics.median(ratios), "lowest_vs_reader": ratios[0],
        "misses": [run for run in runs if run["missed"]],
    }  # fmt: skip


def processes(jobs: int) -> AbstractContextManager[Executor | None]:
    """A pool of `jobs` processes for `run_draws`, or none (this process) for one."""
    return ProcessPoolExecutor(jobs) if jobs > 1 else nullcontext()


def suite(jobs: int) -> None:
    """Every draw of `SUITE`, written to `results/unseen.json` (the table of the benchmarks page)."""
    table = []
    with processes(jobs) as pool:
        for family, first_seed, seeds, loads in SUITE:
            runs = list(run_draws(family, first_seed, seeds, loads, pool))
            table.append(summed(family, first_seed, seeds, loads, runs))
            print(f"{family:12s} from seed {first_seed:6d}, {seeds} seeds, {','.join(loads):14s} "
                  f"{table[-1]['missed']} of {len(runs)} runs missed a target", flush=True)  # fmt: skip
    document = {"environment": environment(), "command": "python -m benchmarks.unseen --suite", "table": table}
    RESULTS.write_text(json.dumps(document, indent=1) + "\n")


def _cores() -> int:
    """The cores this process may run on (its affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every system
        return os.cpu_count() or 1


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.unseen", description=__doc__)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="neighbours")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=60, help="how many seeds (default 60)")
    known = ", ".join(ALL_LOADS)
    parser.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated, of {known} (default %(default)s)")
    parser.add_argument(
        "--suite", action="store_true", help=f"run every draw the benchmarks page reports and write {RESULTS.name}"
    )
    parser.add_argument("--jobs", type=int, default=_cores(), help="processes (default: one a core)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    if args.suite:
        chosen = [f"--{name.replace('_', '-')}" for name in ("family", "first_seed", "seeds", "loads")
                  if getattr(args, name) != parser.get_default(name)]  # fmt: skip
        if chosen:
            parser.error(f"--suite runs the draws of SUITE: drop {', '.join(chosen)}, or drop --suite to run those")
        suite(args.jobs)
        return
    loads = args.loads.split(",")
    unknown = [load for load in loads if load not in ALL_LOADS]
    if unknown:
        parser.error(f"unknown load {', '.join(unknown)}: choose among {', '.join(ALL_LOADS)}")
    runs = []
    with processes(args.jobs) as pool:
        for run in run_draws(args.family, args.first_seed, args.seeds, loads, pool):
            print(line(run), flush=True)
            runs.append(run)
    print(f"{sum(bool(run['missed']) for run in runs)} of {len(runs)} runs missed a target")


if __name__ == "__main__":
    main()
