"""`python -m benchmarks.batching`: adaptive batching against fixed batch sizes, on virtual time.

A simulated card (24 GiB, 8 GiB of weights) and a batch cost model: a batch of n items takes
`a + b*n` seconds and holds `n * item + workspace` bytes while it runs. `CLIENTS` callers in a
closed loop each send their next item as soon as the last one is answered; a caller gives up after
`DEADLINE_S`. One batch runs at a time, closed when it holds what may run or `max_wait_s` after its
first item, as `adaptive_gate.batch` does. The adaptive run drives the library's own `BatchPolicy`
and `Assembly`, with a reading before each batch that is `READING_LAG_S` old (a neighbour is seen
a little late, as a sampler would see it) and the batch's peak while it runs.

Policies: `none` (one item per call, no waiting), `fixed-N` (batches of up to N; an out-of-memory
error fails the batch's callers, as a batcher with a fixed size does) and `adaptive` (the policy;
an OOM splits the batch in halves and retries them). Scenarios: a steady card, and a neighbour
that takes 8 GiB for the middle third of the run. Virtual time: a run of 60 s takes a fraction of
a second and gives the same numbers on every machine.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptive_gate._batch.batching import Assembly, Entry
from adaptive_gate._batch.policy import BatchPolicy

from .environment import environment

GiB = 2**30
RESULTS = Path(__file__).parent / "results"
TOTAL_BYTES = 24 * GiB
WEIGHTS_BYTES = 8 * GiB
ITEM_BYTES = GiB // 2
WORKSPACE_BYTES = 2 * GiB
A_S, B_S = 0.020, 0.002  # a batch of n takes A_S + B_S * n
OOM_S = 0.005  # an allocation that fails fails early in the batch
DEADLINE_S = 5.0
MAX_WAIT_S = 0.005
READING_LAG_S = 0.1
CLIENTS = 64
DURATION_S = 60.0
NEIGHBOUR_BYTES = 8 * GiB
FIXED = [1, 2, 4, 8, 16, 32]


@dataclass
class Run:
    completed: int = 0
    late: int = 0
    gave_up: int = 0
    failed_oom: int = 0
    ooms: int = 0
    splits: int = 0
    batches: int = 0
    series: list[tuple[float, int, float]] = field(default_factory=list)  # (start s, items, free GiB)

    def summary(self, duration_s: float) -> dict[str, Any]:
        items = [n for _, n, _ in self.series]
        return {
            "goodput_per_s": round(self.completed / duration_s, 1),
            "late": self.late,
            "gave_up": self.gave_up,
            "failed_by_oom": self.failed_oom,
            "batch_ooms": self.ooms,
            "splits": self.splits,
            "batches": self.batches,
            "mean_batch": round(sum(items) / len(items), 2) if items else None,
        }


def neighbour_at(scenario: str, t_s: float, duration_s: float) -> int:
    if scenario == "neighbour" and duration_s / 3 <= t_s < 2 * duration_s / 3:
        return NEIGHBOUR_BYTES
    return 0


def simulate(scenario: str, policy_name: str, *, clients: int, duration_s: float, seed: int = 1) -> Run:
    """Closed loop: `clients` callers, each sending its next item as soon as the last is answered."""
    rng = random.Random(seed)
    arrivals = [rng.uniform(0.0, 0.01) for _ in range(clients)]
    heapq.heapify(arrivals)
    fixed = None if policy_name in ("adaptive", "none") else int(policy_name.split("-")[1])
    policy = BatchPolicy() if policy_name == "adaptive" else None
    max_wait_s = 0.0 if policy_name == "none" else MAX_WAIT_S
    line: Assembly[int] = Assembly()
    run = Run()
    now_s = 0.0
    while now_s < duration_s:
        while arrivals and arrivals[0] <= now_s:
            line.add(Entry(run.batches, 1.0, heapq.heappop(arrivals)))
        for _ in _drop_expired(line, now_s):
            run.gave_up += 1
            heapq.heappush(arrivals, now_s)
        if not len(line):
            now_s = arrivals[0]
            continue
        items, units = _limits(policy, fixed, policy_name)
        due_s = line.due_s(max_wait_s)
        assert due_s is not None
        if not line.full(items, units) and due_s > now_s:
            now_s = min(due_s, arrivals[0] if arrivals else math.inf)
            continue
        if policy is not None:
            seen_s = max(0.0, now_s - READING_LAG_S)
            policy.reading(now_s, WEIGHTS_BYTES + neighbour_at(scenario, seen_s, duration_s), TOTAL_BYTES)
            items, units = _limits(policy, fixed, policy_name)
        batch = line.take(items, units)
        now_s = _run_batch(scenario, batch, policy, run, now_s, duration_s)
        for _ in batch:  # every caller answered (or failed) sends its next item
            heapq.heappush(arrivals, now_s)
    return run


def _limits(policy: BatchPolicy | None, fixed: int | None, name: str) -> tuple[int, float]:
    if policy is not None:
        limits = policy.limits()
        return limits.items, limits.units
    return (1 if name == "none" else fixed or 1), math.inf


def _drop_expired(line: Assembly[int], now_s: float) -> list[Entry[int]]:
    dropped = []
    while (first := line.first()) is not None and now_s - first.arrived_s > DEADLINE_S:
        line.remove(first)
        dropped.append(first)
    return dropped


def _run_batch(
    scenario: str, batch: list[Entry[int]], policy: BatchPolicy | None, run: Run, now_s: float, duration_s: float
) -> float:
    """Run a batch (and, for the adaptive policy, the halves of one that ran out); the time after."""
    parts = [batch]
    while parts:
        part = parts.pop()
        n = len(part)
        base_bytes = WEIGHTS_BYTES + neighbour_at(scenario, now_s, duration_s)
        run.series.append((now_s, n, (TOTAL_BYTES - base_bytes) / GiB))
        if base_bytes + WORKSPACE_BYTES + n * ITEM_BYTES > TOTAL_BYTES:
            now_s += OOM_S
            run.ooms += 1
            if policy is None or n == 1:
                run.failed_oom += n
                continue
            policy.batch_oom(now_s, units=n)
            run.splits += 1
            parts += [part[n // 2 :], part[: n // 2]]  # the older half runs first
            continue
        latency_s = A_S + B_S * n
        now_s += latency_s
        run.batches += 1
        if policy is not None:
            peak = base_bytes + WORKSPACE_BYTES + n * ITEM_BYTES
            policy.batch_done(now_s, items=n, units=n, latency_s=latency_s, peak_used_bytes=peak)
        for entry in part:
            if now_s - entry.arrived_s <= DEADLINE_S:
                run.completed += 1
            else:
                run.late += 1
    return now_s


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batching", description=__doc__)
    parser.add_argument("--clients", type=int, default=CLIENTS, help="closed-loop callers")
    parser.add_argument("--duration", type=float, default=DURATION_S, help="virtual seconds per run")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()
    policies = ["none", *(f"fixed-{n}" for n in FIXED), "adaptive"]
    document: dict[str, Any] = {
        "environment": environment(),
        "command": "python -m benchmarks.batching" + ("" if args.clients == CLIENTS else f" --clients {args.clients}"),
        "time": "virtual",
        "model": {"total_gib": 24, "weights_gib": 8, "item_gib": 0.5, "workspace_gib": 2, "a_s": A_S, "b_s": B_S,
                  "clients": args.clients, "duration_s": args.duration, "deadline_s": DEADLINE_S,
                  "max_wait_s": MAX_WAIT_S, "reading_lag_s": READING_LAG_S, "neighbour_gib": 8},
        "runs": {},
        "series": {},
    }  # fmt: skip
    verdicts = []
    for scenario, target in (("steady", 0.95), ("neighbour", 1.1)):
        runs = {p: simulate(scenario, p, clients=args.clients, duration_s=args.duration) for p in policies}
        summaries = {p: r.summary(args.duration) for p, r in runs.items()}
        document["runs"][scenario] = summaries
        document["series"][scenario] = [(round(t, 4), n, round(free, 2)) for t, n, free in runs["adaptive"].series]
        print_table(scenario, summaries, args.clients)
        verdicts += check(scenario, summaries, target)
    print("\nTargets (ratios measured side by side in this run, virtual time):")
    for line in verdicts:
        print("  " + line)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batching.json").write_text(json.dumps(document) + "\n")
    if not args.no_plot:
        from .batching_plot import plot_batching

        plot_batching(document, RESULTS / "batching.png")
    sys.exit(0 if all(v.startswith("MET") for v in verdicts) else 1)


def check(scenario: str, summaries: dict[str, dict[str, Any]], target: float) -> list[str]:
    fixed = {p: s["goodput_per_s"] for p, s in summaries.items() if p.startswith("fixed-")}
    best = max(fixed, key=lambda p: fixed[p])
    adaptive = summaries["adaptive"]
    ratio = adaptive["goodput_per_s"] / fixed[best] if fixed[best] else math.inf
    return [
        ("MET    " if ratio >= target else "MISSED ")
        + f"{scenario}: adaptive {adaptive['goodput_per_s']}/s vs best fixed ({best}) {fixed[best]}/s "
        f"= {ratio:.2f}x (target >= {target})",
        ("MET    " if adaptive["failed_by_oom"] == 0 else "MISSED ")
        + f"{scenario}: requests failed by a batch OOM under adaptive: {adaptive['failed_by_oom']} "
        f"({adaptive['batch_ooms']} batch OOMs, {adaptive['splits']} splits) (target 0)",
    ]


def print_table(scenario: str, summaries: dict[str, dict[str, Any]], clients: int) -> None:
    columns = ["goodput_per_s", "mean_batch", "batch_ooms", "failed_by_oom", "splits", "late", "gave_up"]
    print(f"\n{scenario} ({clients} closed-loop callers, deadline {DEADLINE_S} s)")
    print(f"  {'policy':10} " + " ".join(f"{c:>14}" for c in columns))
    for policy, summary in summaries.items():
        print(f"  {policy:10} " + " ".join(f"{'-' if summary[c] is None else summary[c]!s:>14}" for c in columns))


if __name__ == "__main__":
    main()
