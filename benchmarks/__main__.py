"""`python -m benchmarks [--quick]`: the gate against a fixed semaphore and no gate, side by side.

Every scenario runs every policy in one process, one after the other, on the same simulated card
and the same arrival sequence. Prints a table, checks the targets (as ratios measured in this run),
and writes `benchmarks/results/<scenario>.json` and `<scenario>.png`.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from .environment import environment
from .harness import DEADLINE_S, RunResult, run
from .report import plot_document
from .scenarios import CHANGING, FULL_PLAN, FULL_STATIC, LOADS, QUICK_PLAN, QUICK_STATIC, SCENARIOS

RESULTS = Path(__file__).parent / "results"
# adaptive / reader, at least: the reader reads the card at the gate's sample period knowing each
# request's bytes, the ceiling for any gate that reads it. Sizes the gate cannot tell apart (mixed,
# told nothing) are the limitation docs/benchmarks.md states.
READER_SHARE = {"mixed": 0.7}
DEFAULT_READER_SHARE = 0.95
# Where an OOM takes the worker down (`crash_s`), runs last at least this long: one unavoidable OOM
# (a change of the card that no reading foretold) must not decide the run.
MIN_CRASH_RUN_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer loads and N, shorter runs (a few minutes)")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="run only these scenarios")
    parser.add_argument(
        "--duration", type=float, help="seconds of arrivals per run (default 12, quick 8; 10 at least where OOMs crash)"
    )
    parser.add_argument("--no-http", action="store_true", help="skip the runs against the demo service over HTTP")
    args = parser.parse_args()
    logging.getLogger("adaptive_gate").setLevel(logging.ERROR)  # one line per OOM would drown the table

    plan = QUICK_PLAN if args.quick else FULL_PLAN
    statics = QUICK_STATIC if args.quick else FULL_STATIC
    duration_s = args.duration or (8.0 if args.quick else 12.0)
    policies = ["none", *(f"static-{n}" for n in statics), "oracle", "reader", "adaptive"]
    command = "python -m benchmarks" + (" --quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    verdicts: list[str] = []

    for name, loads in plan.items():
        if args.only and name not in args.only:
            continue
        scenario = SCENARIOS[name]
        run_s = duration_s if args.duration or scenario.crash_s <= 0 else max(duration_s, MIN_CRASH_RUN_S)
        runs: dict[str, dict[str, RunResult]] = {}
        for load in loads:
            multiple, clients = LOADS[load]
            rate = None if multiple is None else multiple * scenario.capacity_per_s
            runs[load] = {}
            for policy in policies:
                started = time.monotonic()
                one_run = partial(run, scenario, policy, load=load, rate_per_s=rate, clients=clients)
                result = anyio.run(partial(one_run, duration_s=run_s))
                runs[load][policy] = result
                print(f"  {name:14} {load:10} {policy:10} done in {time.monotonic() - started:.0f} s", file=sys.stderr)
            print_table(name, load, runs[load])
            verdicts += check_targets(name, load, runs[load])
        document = {
            "command": command,
            "environment": environment(),
            "scenario": {"name": name, "description": scenario.description, "deadline_s": DEADLINE_S,
                         "capacity_per_s": scenario.capacity_per_s, "duration_s": run_s},
            "runs": {load: {p: r.summary() for p, r in by_policy.items()} for load, by_policy in runs.items()},
            "series": {load: {p: r.series for p, r in by_policy.items()} for load, by_policy in runs.items()},
            "oom_times_s": {load: {p: r.oom_times_s for p, r in by_policy.items()} for load, by_policy in runs.items()},
        }  # fmt: skip
        (RESULTS / f"{name}.json").write_text(json.dumps(document, indent=1) + "\n")
        plot_document(name, document)

    print("\nTargets (ratios measured side by side in this run):")
    for line in verdicts:
        print("  " + line)
    if not args.no_http and not args.only:
        print("\nThe demo service over HTTP (uvicorn, real clients):", flush=True)
        subprocess.run([sys.executable, "-m", "benchmarks.http_demo", *(["--quick"] if args.quick else [])], check=True)


def best_static(by_policy: dict[str, RunResult]) -> tuple[str, float]:
    statics = {p: r.summary()["goodput_per_s"] for p, r in by_policy.items() if p.startswith("static-")}
    policy = max(statics, key=lambda p: statics[p])
    return policy, statics[policy]


def check_targets(name: str, load: str, by_policy: dict[str, RunResult]) -> list[str]:
    adaptive = by_policy["adaptive"].summary()
    goodput = adaptive["goodput_per_s"]
    lines = []
    reader = by_policy["reader"].summary()
    share = READER_SHARE.get(name, DEFAULT_READER_SHARE)
    ratio = goodput / reader["goodput_per_s"] if reader["goodput_per_s"] else float("inf")
    lines.append(verdict(ratio >= share, f"{name} {load}: adaptive {goodput} /s vs reader {reader['goodput_per_s']} /s "
                         f"= {ratio:.2f}x (target >= {share})"))  # fmt: skip
    oracle_goodput = by_policy["oracle"].summary()["goodput_per_s"]
    ratio = goodput / oracle_goodput if oracle_goodput else float("inf")
    lines.append(f"        {name} {load}: adaptive vs oracle {oracle_goodput} /s = {ratio:.2f}x")
    static, static_goodput = best_static(by_policy)
    ratio = goodput / static_goodput if static_goodput else float("inf")
    wanted = 1.2 if name == "classic-crash" else 1.05 if name in CHANGING else None
    if wanted is not None:
        lines.append(verdict(ratio >= wanted, f"{name} {load}: adaptive vs best static ({static}) {static_goodput} /s "
                             f"= {ratio:.2f}x (target >= {wanted})"))  # fmt: skip
    if load == "4x":
        none = by_policy["none"].summary()["goodput_per_s"]
        ratio = goodput / none if none else float("inf")
        lines.append(verdict(ratio >= 2, f"{name} {load}: adaptive vs none = {ratio:.2f}x (target >= 2)"))
    allowed = reader["ooms"] + len(SCENARIOS[name].phases) - 1
    lines.append(verdict(adaptive["ooms"] <= allowed, f"{name} {load}: adaptive OOMs {adaptive['ooms']} "
                         f"(target <= {allowed}: the reader's {reader['ooms']}, one a change)"))  # fmt: skip
    p99 = adaptive["p99_ms"]
    within = p99 is not None and p99 <= DEADLINE_S * 1000
    lines.append(verdict(within, f"{name} {load}: p99 of successes {p99} ms (deadline {DEADLINE_S * 1000:.0f} ms)"))
    return lines


def verdict(ok: bool, text: str) -> str:
    return ("MET    " if ok else "MISSED ") + text


def print_table(name: str, load: str, by_policy: dict[str, RunResult]) -> None:
    columns: list[tuple[str, str]] = [
        ("goodput/s", "goodput_per_s"), ("p50 ms", "p50_ms"), ("p95 ms", "p95_ms"), ("p99 ms", "p99_ms"),
        ("503s", "rejected_503"), ("503 in ms", "reject_answer_ms_mean"), ("OOMs", "ooms"), ("500s", "errors_500"),
        ("crashed", "crash_failures"), ("gave up", "client_gave_up"), ("settle s", "settle_s"),
    ]  # fmt: skip
    print(f"\n{name} at {load}")
    print(f"  {'policy':10} " + " ".join(f"{title:>10}" for title, _ in columns))
    for policy, result in by_policy.items():
        summary: dict[str, Any] = result.summary()
        cells = ["-" if summary[key] is None else str(summary[key]) for _, key in columns]
        print(f"  {policy:10} " + " ".join(f"{cell:>10}" for cell in cells))


if __name__ == "__main__":
    main()
