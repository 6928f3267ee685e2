"""`python -m benchmarks.report`: the committed results as the Markdown tables of the README."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .plots import plot_scenario

RESULTS = Path(__file__).parent / "results"
ORDER = [
    "classic", "neighbour", "neighbour-greedy", "growth", "exact-fit", "jitter", "mixed", "mixed-cost", "mixed-routes",
    "classic-crash", "no-lifespan",
]  # fmt: skip


def best_static(runs: dict[str, dict[str, Any]]) -> str:
    statics = [p for p in runs if p.startswith("static-")]
    return max(statics, key=lambda p: runs[p]["goodput_per_s"])


def made_by(document: dict[str, Any]) -> str:
    """The line under a table: what produced it, from the JSON (machine, versions, date, commit)."""
    env = document.get("environment")
    if env is None:
        return f"`{document.get('command', '?')}`"
    packages = ", ".join(f"{name} {version}" for name, version in env["packages"].items() if version)
    return (
        f"`{document['command']}` on {env['machine']} ({env['cores']} cores), Python {env['python']}, "
        f"{packages}; {env['date']}, commit {env['commit']}"
    )


def virtual_rows() -> list[str]:
    """`benchmarks/results/virtual.json`: every scenario on virtual time against both ceilings."""
    path = RESULTS / "virtual.json"
    if not path.exists():
        return []
    document = json.loads(path.read_text())
    rows = [
        "| scenario | load | adaptive/s | / reader | / oracle | / best static-N | OOMs: adaptive (reader) "
        "| back after a neighbour |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in document["table"]:
        back = "-" if entry["recovery_s"] is None else f"{entry['recovery_s']:.1f} s"
        rows.append(
            f"| {entry['scenario']} | {entry['load']} | {entry['adaptive_per_s']:.1f} | {entry['vs_reader']:.2f} | "
            f"{entry['vs_oracle']:.2f} | {entry['vs_best_static']:.2f} ({entry['best_static']}) | "
            f"{entry['adaptive_ooms']} ({entry['reader_ooms']}) | {back} |"
        )
    return [*rows, "", made_by(document)]


def ablation_rows() -> list[str]:
    """`benchmarks/results/ablation.json`: adaptive / reader (and its OOMs) with each rule taken out."""
    path = RESULTS / "ablation.json"
    if not path.exists():
        return []
    document = json.loads(path.read_text())
    variants = list(document["table"][0]["variants"])
    rows = ["| scenario | load | " + " | ".join(variants) + " |", "| --- | --- |" + " --- |" * len(variants)]
    for entry in document["table"]:
        cells = [f"{v['vs_reader']:.2f} ({v['ooms']})" for v in entry["variants"].values()]
        rows.append(f"| {entry['scenario']} | {entry['load']} | " + " | ".join(cells) + " |")
    return [*rows, "", made_by(document)]


def scenario_rows() -> list[str]:
    rows = [
        "| scenario | load | goodput/s: none | best static-N | oracle | reader | adaptive | adaptive / reader | "
        "adaptive / best static | OOMs: static / reader / adaptive |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    made: list[str] = []
    for name in ORDER:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        document = json.loads(path.read_text())
        if "reader" not in next(iter(document["runs"].values())):
            continue  # a run from before the reader was a policy: not comparable
        made.append(made_by(document))
        for load, runs in document["runs"].items():
            best = best_static(runs)
            none, static, adaptive, oracle, reader = (
                runs["none"], runs[best], runs["adaptive"], runs["oracle"], runs["reader"]
            )  # fmt: skip
            goodput = adaptive["goodput_per_s"]
            to_static = f"{goodput / static['goodput_per_s']:.2f}" if static["goodput_per_s"] else "-"
            to_reader = f"{goodput / reader['goodput_per_s']:.2f}" if reader["goodput_per_s"] else "-"
            rows.append(
                f"| {name} | {load} | {none['goodput_per_s']} | {static['goodput_per_s']} ({best}) | "
                f"{oracle['goodput_per_s']} | {reader['goodput_per_s']} | {goodput} | {to_reader} | {to_static} | "
                f"{static['ooms']} / {reader['ooms']} / {adaptive['ooms']} |"
            )
    return [*rows, "", *sorted(set(made))]


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


README = Path(__file__).parent.parent / "README.md"


def tables() -> dict[str, list[str]]:
    """The tables the README shows, by the name of their place in it (`<!-- name -->`)."""
    return {"virtual": virtual_rows(), "ablation": ablation_rows(), "realtime": scenario_rows()}


def rendered(text: str) -> str:
    """`text` with each `<!-- name --> ... <!-- /name -->` holding the table made from the JSON."""
    for name, rows in tables().items():
        opening, closing = f"<!-- {name} -->\n", f"<!-- /{name} -->"
        start, end = text.find(opening), text.find(closing)
        if start < 0 or end < start:
            raise ValueError(f"README.md has no {opening.strip()} ... {closing} pair to render {name} into")
        text = text[: start + len(opening)] + "\n".join(rows) + "\n" + text[end:]
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plots", action="store_true", help="draw the PNGs again from the JSON results")
    parser.add_argument("--readme", action="store_true", help="render the tables into README.md")
    args = parser.parse_args()
    if args.plots:
        redraw_plots()
    if args.readme:
        README.write_text(rendered(README.read_text()))
        return
    for rows in (virtual_rows(), ablation_rows(), scenario_rows(), http_rows()):
        print("\n".join(rows))
        print()


if __name__ == "__main__":
    main()
