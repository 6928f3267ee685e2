"""`python -m benchmarks.report`: the committed results as the Markdown tables of the README."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .plots import plot_scenario

RESULTS = Path(__file__).parent / "results"
ORDER = [
    "classic", "neighbour", "neighbour-greedy", "growth", "mixed", "mixed-cost", "mixed-routes", "classic-crash",
    "no-lifespan",
]  # fmt: skip


def best_static(runs: dict[str, dict[str, Any]]) -> str:
    statics = [p for p in runs if p.startswith("static-")]
    return max(statics, key=lambda p: runs[p]["goodput_per_s"])


def scenario_rows() -> list[str]:
    rows = [
        "| scenario | load | goodput/s: none | best static-N | oracle | adaptive | adaptive / oracle | "
        "adaptive / best static | OOMs: static / oracle / adaptive | p99 ms: static / adaptive |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ORDER:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        document = json.loads(path.read_text())
        for load, runs in document["runs"].items():
            best = best_static(runs)
            none, static, adaptive = runs["none"], runs[best], runs["adaptive"]
            oracle = runs.get("oracle")
            goodput = adaptive["goodput_per_s"]
            to_static = f"{goodput / static['goodput_per_s']:.2f}" if static["goodput_per_s"] else "-"
            to_oracle = f"{goodput / oracle['goodput_per_s']:.2f}" if oracle and oracle["goodput_per_s"] else "-"
            rows.append(
                f"| {name} | {load} | {none['goodput_per_s']} | {static['goodput_per_s']} ({best}) | "
                f"{oracle['goodput_per_s'] if oracle else '-'} | {goodput} | {to_oracle} | {to_static} | "
                f"{static['ooms']} / {oracle['ooms'] if oracle else '-'} / {adaptive['ooms']} | "
                f"{static['p99_ms']} / {adaptive['p99_ms']} |"
            )
    return rows


def http_rows() -> list[str]:
    path = RESULTS / "http_demo.json"
    if not path.exists():
        return []
    document = json.loads(path.read_text())
    rows = [
        f"Open loop at {document['rate_per_s']:.1f} req/s for {document['duration_s']:.0f} s per run, "
        f"deadline {document['deadline_s']:.0f} s (`{document['command']}`):",
        "",
        "| scenario | policy | goodput/s | p50 / p99 ms | 503s | 500s | gave up | wrk closed loop, good/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scenario, runs in document["runs"].items():
        for policy, run in runs.items():
            wrk = run.get("wrk_closed_loop_16") or {}
            rows.append(
                f"| {scenario} | {policy} | {run['goodput_per_s']} | {run['p50_ms']} / {run['p99_ms']} | "
                f"{run['503']} | {run['500']} | {run['gave_up']} | {wrk.get('goodput_per_s', '-')} |"
            )
    return rows


def plot_document(name: str, document: dict[str, Any]) -> None:
    """`<name>.png` from a scenario's results document: the 2x load, else the last one run."""
    load = "2x" if "2x" in document["runs"] else list(document["runs"])[-1]
    plot_scenario(
        name,
        document["scenario"]["description"],
        load,
        summaries=document["runs"][load],
        series=document["series"][load],
        path=RESULTS / f"{name}.png",
        oom_times_s=document.get("oom_times_s", {}).get(load),
    )


def redraw_plots() -> None:
    for name in ORDER:
        path = RESULTS / f"{name}.json"
        if path.exists():
            plot_document(name, json.loads(path.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plots", action="store_true", help="draw the PNGs again from the JSON results")
    if parser.parse_args().plots:
        redraw_plots()
    print("\n".join(scenario_rows()))
    print()
    print("\n".join(http_rows()))


if __name__ == "__main__":
    main()
