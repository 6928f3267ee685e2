"""`python -m benchmarks.report`: the committed results (`benchmarks/results/*.json`) as Markdown tables.

`--readme` renders the README's one table and its overhead sentence between their markers
(`<!-- name -->` ... `<!-- /name -->`); the documentation site renders the other tables into
`docs/benchmarks.md` the same way when it is built (`docs/hooks.py` calls `docs_tables()`). No
figure is copied by hand, so none can drift from the JSON it came from.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
README = Path(__file__).parent.parent / "README.md"
ORDER = [
    "classic", "neighbour", "neighbour-greedy", "growth", "exact-fit", "jitter", "mixed", "mixed-cost", "mixed-routes",
    "batches", "classic-crash", "no-lifespan", "late-start", "decode-first",
]  # fmt: skip
# What each virtual-time scenario does to the card, in the few words the README's table has room for.
SHORT = {
    "classic": "five requests fit, nothing changes",
    "neighbour": "another process takes 6 GiB for a while",
    "neighbour-greedy": "another process grows into what is free",
    "growth": "inputs double in size half-way",
    "mixed": "a quarter of requests 4x the size, not told",
    "mixed-cost": "the same mix, told through `cost`",
    "mixed-routes": "the same mix, large ones on their own route",
    "classic-crash": "an OOM kills the worker for 2 s",
    "exact-fit": "a neighbour leaves room for exactly three",
    "small-card": "a 16 GiB card and a neighbour",
    "shrink": "inputs halve in size half-way",
    "fragmented": "an allocation may fail below the total",
    "jitter": "latency noise that load does not cause",
    "too-large": "one request in twelve never fits",
    "small-neighbour": "a neighbour smaller than one request",
    "mixed-routes-tight": "the same, on a card with room for five of them",
    "batches": "batches of 1 to 8 told their size; each holds a workspace too",
    "batches-late": "the same, allocating up to 50 ms after admission",
    "two-neighbours": "two neighbours come, one after the other",
    "survived-neighbour": "a neighbour takes five of eight; OOMs do not crash",
    "late-start": "requests allocate up to 50 ms after admission",
    "decode-first": "requests allocate up to 0.3 s after admission",
}


LOADS = {"2x": "arrivals at twice the capacity", "closed-32": "32 clients in a closed loop"}


def load(name: str) -> dict[str, Any] | None:
    """`benchmarks/results/<name>.json`, or None where that benchmark has not been run."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def best_static(runs: dict[str, dict[str, Any]]) -> str:
    statics = [p for p in runs if p.startswith("static-")]
    return max(statics, key=lambda p: runs[p]["goodput_per_s"])


def made_by(document: dict[str, Any]) -> str:
    """The line under a table: what produced it, from the JSON (machine, versions, date). The commit
    stays in the JSON: the pages say what was measured and when, not which revision of this repository."""
    env = document.get("environment")
    if env is None:
        return f"`{document.get('command', '?')}`"
    return f"{made_on(document)}; {env['date']}"


def made_on(document: dict[str, Any], sep: str = " ") -> str:
    """The command, the machine and the versions, without the date or commit (for the README);
    `sep` goes between the machine and the versions."""
    env = document.get("environment")
    if env is None:
        return f"`{document.get('command', '?')}`"
    packages = ", ".join(f"{name} {version}" for name, version in env["packages"].items() if version)
    return f"`{document['command']}` on {env['machine']} ({env['cores']} cores),{sep}Python {env['python']}, {packages}"


def markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    """Rows of like dicts as a Markdown table, their keys the columns."""
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return lines + ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]


def summary_rows() -> list[str]:
    """The README's one table: each scenario on virtual time, both loads in one cell."""
    document = load("virtual")
    if document is None:
        return []
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for entry in document["table"]:
        by_scenario.setdefault(entry["scenario"], []).append(entry)
    rows = [
        "| scenario | what the card does | gate / best fixed limit | gate / reader | OOMs: gate (reader) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, entries in by_scenario.items():
        static = ", ".join(f"{e['vs_best_static']:.2f}" for e in entries)
        reader = ", ".join(f"{e['vs_reader']:.2f}" for e in entries)
        ooms = ", ".join(f"{e['adaptive_ooms']} ({e['reader_ooms']})" for e in entries)
        rows.append(f"| {name} | {SHORT.get(name, '')} | {static} | {reader} | {ooms} |")
    loads = " and ".join(LOADS.get(load, load) for load in dict.fromkeys(e["load"] for e in document["table"]))
    return [
        *rows,
        "",
        "Goodput (answers within their deadline) as a ratio, one figure per load:",
        f"{loads}, {document['duration_s']:.0f} s of virtual time each.",
        f"{made_on(document, sep=chr(10))}.",
    ]


def overhead_us() -> tuple[float, float | None] | None:
    """What the gate with its defaults adds to a trivial route: in process, and of server CPU through
    uvicorn (None where that was not measured); None where `benchmarks.overhead` has not been run."""
    document = load("overhead")
    if document is None:
        return None
    in_process = document["in_process"]["added_us_defaults"]
    uvicorn = document.get("uvicorn", {})
    if "cpu_us_defaults" not in uvicorn:
        return in_process, None
    return in_process, uvicorn["cpu_us_defaults"] - uvicorn["cpu_us_no_gate"]


def overhead_sentence() -> list[str]:
    """The README's word on cost: microseconds per request, and the inference time it is 1% of."""
    measured = overhead_us()
    if measured is None:
        return []
    in_process, uvicorn = measured
    worst = max(in_process, uvicorn or 0.0)
    one_percent_ms = max(1, math.ceil(worst * 100 / 1000))
    through = "" if uvicorn is None else f" and about {uvicorn:.0f} µs of server CPU through uvicorn"
    return [
        f"What it costs: on a trivial route the gate adds about {in_process:.0f} µs per request in process,",
        f"{through} (`python -m benchmarks.overhead`).".lstrip(),
        f"Behind inference that takes {one_percent_ms} ms or more, that is under 1%.",
    ]


def virtual_rows() -> list[str]:
    """`benchmarks/results/virtual.json`: every scenario on virtual time against both ceilings."""
    document = load("virtual")
    if document is None:
        return []
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


# A run moves without a rule where its goodput moves by this share of the reader's, or by one OOM.
MOVE_SHARE = 0.02
Figures = dict[str, Any]  # one controller's figures in one run of the ablation: `vs_reader` and `ooms`
AblationRun = tuple[dict[str, Any], Figures, Figures]  # a run of the ablation, the full controller's, the variant's


def _goodput_fell(full: Figures, without: Figures) -> float:
    """How far goodput fell without the rule, in shares of the reader's, beyond `MOVE_SHARE` (> 0: it moved)."""
    return full["vs_reader"] - without["vs_reader"] - MOVE_SHARE + 1e-9  # a hair: 0.30 -> 0.28 is a move


def _ooms_rose(full: Figures, without: Figures) -> float:
    """How many more OOMs without the rule, less the one that makes a move (>= 0: it moved)."""
    return without["ooms"] - full["ooms"] - 1


def _moves(full: Figures, without: Figures) -> tuple[bool, bool]:
    """Whether a run does worse without a rule on one count (less goodput, more OOMs), and whether better."""
    worse = _goodput_fell(full, without) > 0 or _ooms_rose(full, without) >= 0
    better = _goodput_fell(without, full) > 0 or _ooms_rose(without, full) >= 0
    return worse, better


def _most(runs: list[AblationRun], amount: Callable[[Figures, Figures], float], least: float) -> str:
    """The run of `runs` where `amount` (full, without) is largest, as a cell; "-" where none reaches `least`."""
    entry, full, without = max(runs, key=lambda run: amount(run[1], run[2]))
    if amount(full, without) < least:
        return "-"
    return (
        f"{entry['scenario']}, {entry['load']}: {full['vs_reader']:.2f} ({full['ooms']}) -> "
        f"{without['vs_reader']:.2f} ({without['ooms']})"
    )


def ablation_rows() -> list[str]:
    """`benchmarks/results/ablation.json`: each rule, the runs where taking it out costs most goodput and most
    OOMs (adaptive / reader, and the OOMs in brackets: with the rule -> without; "-" where it costs neither),
    and how many runs do worse without it on one count and no better on the other, better, or both (a trade)."""
    from .ablation import RULES

    document = load("ablation")
    if document is None:
        return []
    rows = [
        "| rule | without it, goodput falls most in | OOMs rise most in | runs worse without | better | a trade |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for variant, rule in RULES.items():
        runs: list[AblationRun] = [
            (entry, entry["variants"]["full"], entry["variants"][variant])
            for entry in document["table"]
            if variant in entry["variants"] and "full" in entry["variants"]
        ]
        if not runs:
            continue
        moves = [_moves(full, without) for _, full, without in runs]
        worse = sum(w and not b for w, b in moves)
        better = sum(b and not w for w, b in moves)
        trades = sum(w and b for w, b in moves)
        falls, rises = _most(runs, _goodput_fell, least=1e-12), _most(runs, _ooms_rose, least=0)
        rows.append(f"| {rule} | {falls} | {rises} | {worse} | {better} | {trades} |")
    return [*rows, "", made_by(document)]


def unseen_rows() -> list[str]:
    """`benchmarks/results/unseen.json`: the draws of `python -m benchmarks.unseen --suite`, family by family."""
    from .unseen import DRAWS

    document = load("unseen")
    if document is None:
        return []
    rows = [
        "| family | what it draws | seeds | loads | missed a target | by what it served | by its OOMs "
        "| by the way back | the misses | adaptive / reader: median (lowest) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    shown: set[str] = set()  # families whose draws a row above said
    for entry in document["table"]:
        first, seeds, family = entry["first_seed"], entry["seeds"], entry["family"]
        draws = "" if family in shown else DRAWS.get(family, "")
        shown.add(family)
        kinds = Counter(miss["scenario"].rsplit("-", 1)[0] for miss in entry["misses"])  # "mix-routes-whole-3"
        which = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()) or "-"
        by = entry["missed_by"]
        rows.append(
            f"| `{family}` | {draws} | {first}-{first + seeds - 1} | "
            f"{', '.join(entry['loads'])} | {entry['missed']} of {entry['runs']} | {by['ratio']} | {by['ooms']} | "
            f"{by['recovery']} | {which} | {entry['median_vs_reader']:.2f} ({entry['lowest_vs_reader']:.2f}) |"
        )
    return [*rows, "", made_by(document)]


def scenario_rows() -> list[str]:
    """`benchmarks/results/<scenario>.json`: the real-time runs of `python -m benchmarks`."""
    rows = [
        "| scenario | load | goodput/s: none | best static-N | oracle | reader | adaptive | adaptive / reader | "
        "adaptive / best static | OOMs: static / reader / adaptive |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    made: list[str] = []
    for name in ORDER:
        document = load(name)
        if document is None:
            continue
        if "reader" not in next(iter(document["runs"].values())):
            continue  # a run from before the reader was a policy: not comparable
        made.append(made_by(document))
        for load_name, runs in document["runs"].items():
            best = best_static(runs)
            none, static, adaptive, oracle, reader = (
                runs["none"], runs[best], runs["adaptive"], runs["oracle"], runs["reader"]
            )  # fmt: skip
            goodput = adaptive["goodput_per_s"]
            to_static = f"{goodput / static['goodput_per_s']:.2f}" if static["goodput_per_s"] else "-"
            to_reader = f"{goodput / reader['goodput_per_s']:.2f}" if reader["goodput_per_s"] else "-"
            rows.append(
                f"| {name} | {load_name} | {none['goodput_per_s']} | {static['goodput_per_s']} ({best}) | "
                f"{oracle['goodput_per_s']} | {reader['goodput_per_s']} | {goodput} | {to_reader} | {to_static} | "
                f"{static['ooms']} / {reader['ooms']} / {adaptive['ooms']} |"
            )
    if not made:
        return []
    return [*rows, *(f"\n{line}" for line in sorted(set(made)))]


def http_rows(name: str = "http_demo") -> list[str]:
    """`benchmarks/results/http_demo*.json`: the demo service over HTTP, one process per policy."""
    document = load(name)
    if document is None:
        return []
    rows = [
        "| scenario | policy | goodput/s | p50 / p99 ms | 503s | 500s | gave up | wrk closed loop, good/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scenario, runs in document["runs"].items():
        for policy, run in runs.items():
            if "error" in run:
                # The service died under the load (an ungated one that ran out of memory): the run has no figures.
                rows.append(f"| {scenario} | {policy} | failed: {run['error']} | - | - | - | - | - |")
                continue
            wrk = run.get("wrk_closed_loop_16") or {}
            rows.append(
                f"| {scenario} | {policy} | {run['goodput_per_s']} | {run['p50_ms']} / {run['p99_ms']} | "
                f"{run['503']} | {run['500']} | {run['gave_up']} | {wrk.get('goodput_per_s', '-')} |"
            )
    return [
        *rows,
        "",
        f"Open loop at {document['rate_per_s']:.1f} req/s for {document['duration_s']:.0f} s per run, "
        f"deadline {document['deadline_s']:.0f} s: {made_by(document)}",
    ]


def overhead_rows() -> list[str]:
    """`benchmarks/results/overhead.json`: a trivial route without the gate, behind a do-nothing
    middleware, behind the gate with its defaults, and behind the gate with `Fixed(64)`."""
    document = load("overhead")
    if document is None:
        return []
    process, server = document["in_process"], document.get("uvicorn")
    rows = [
        "| where | without the gate | do-nothing middleware | the gate, defaults | the gate, `Fixed(64)` |",
        "| --- | --- | --- | --- | --- |",
        f"| in process, µs per call (median of {process['rounds']} paired rounds) | "
        f"{process['median_us_no_gate']:.1f} | +{process['added_us_pass-through']:.1f} | "
        f"+{process['added_us_defaults']:.1f} | +{process['added_us_fixed']:.1f} |",
    ]
    if server:
        rows += [
            f"| through uvicorn, requests/s ({server['rounds']} rounds, `{server['client']}`) | "
            f"{server['rps_no_gate']:,.0f} | {server['ratio_pass-through']:.3f}x | {server['ratio_defaults']:.3f}x | "
            f"{server['ratio_fixed']:.3f}x |",
            f"| through uvicorn, server CPU µs per request | {server['cpu_us_no_gate']:.0f} | "
            f"{server['cpu_us_pass-through']:.0f} | {server['cpu_us_defaults']:.0f} | {server['cpu_us_fixed']:.0f} |",
        ]
    made = made_by(document)  # names the cores where the JSON holds its environment
    return [*rows, "", made if "environment" in document else f"{made} on {document['cpus']} cores"]


def overload_rows() -> list[str]:
    """`benchmarks/results/overload.json`: the overload modes, closed loops, tenants and priorities."""
    document = load("overload")
    if document is None:
        return []
    parts: list[str] = []
    for key in ("overload", "closed_loop", "tenants", "priorities"):
        if document.get(key):
            parts += [*markdown_table(document[key]), ""]
    return [*parts, made_by(document)]


def batching_rows() -> list[str]:
    """`benchmarks/results/batching.json`: items per second against fixed batch sizes, virtual time."""
    document = load("batching")
    if document is None:
        return []
    policies = list(next(iter(document["runs"].values())))
    rows = ["| scenario | " + " | ".join(policies) + " |", "| --- |" + " --- |" * len(policies)]
    for scenario, runs in document["runs"].items():
        cells = []
        for policy in policies:
            run = runs[policy]
            cell = f"{run['goodput_per_s']}"
            if policy == "adaptive":
                cell += f" (mean batch {run['mean_batch']:.1f})"
            if run["failed_by_oom"]:
                cell += f" ({run['failed_by_oom']} failed)"
            cells.append(cell)
        rows.append(f"| {scenario} | " + " | ".join(cells) + " |")
    return [*rows, "", made_by(document)]


def batching_demo_rows() -> list[str]:
    """`benchmarks/results/batching_demo-*.json`: the demo over HTTP with batching on and off."""
    paths = sorted(RESULTS.glob("batching_demo-*.json"))
    if not paths:
        return []
    rows = [
        "| device | model | `--batching on`, per round | `--batching off`, per round | on / off (means) |",
        "| --- | --- | --- | --- | --- |",
    ]
    commands = []
    for path in paths:
        document = json.loads(path.read_text())
        goodput = document["goodput_per_s"]
        rows.append(
            f"| {document['machine']['device']} ({document['machine']['cpus']} cores) | {document['model']} | "
            f"{', '.join(map(str, goodput['on']))} | {', '.join(map(str, goodput['off']))} | "
            f"{document['ratio']:.2f}x |"
        )
        commands.append(f"\n{made_by(document)}")
    return [*rows, *commands]


def scenario_list() -> list[str]:
    """`benchmarks.scenarios`: each scenario and what it does to the card, as the benchmarks define it."""
    from .scenarios import SCENARIOS

    rows = ["| scenario | what happens |", "| --- | --- |"]
    return rows + [f"| `{name}` | {scenario.description} |" for name, scenario in SCENARIOS.items()]


def tables() -> dict[str, list[str]]:
    """What the README shows, by the name of its place there (`<!-- name -->`)."""
    return {"results": summary_rows(), "overhead": overhead_sentence()}


def docs_tables() -> dict[str, list[str]]:
    """What `docs/benchmarks.md` shows, by the name of its place there; rendered when the site is built."""
    return {
        "scenarios": scenario_list(),
        "virtual": virtual_rows(),
        "unseen": unseen_rows(),
        "ablation": ablation_rows(),
        "realtime": scenario_rows(),
        "http": http_rows(),
        "overhead": overhead_rows(),
        "overload": overload_rows(),
        "batching": batching_rows(),
        "batching-demo": batching_demo_rows(),
    }


def rendered(text: str, made: dict[str, list[str]] | None = None, *, where: str = "README.md") -> str:
    """`text` with each `<!-- name --> ... <!-- /name -->` holding the rows made for `name`
    (by default the README's, `tables()`); a place missing from `text` is an error."""
    for name, rows in (tables() if made is None else made).items():
        opening, closing = f"<!-- {name} -->\n", f"<!-- /{name} -->"
        start, end = text.find(opening), text.find(closing)
        if start < 0 or end < start:
            raise ValueError(f"{where} has no {opening.strip()} ... {closing} pair to render {name} into")
        text = text[: start + len(opening)] + "".join(f"{row}\n" for row in rows) + text[end:]
    return text


def plot_document(name: str, document: dict[str, Any]) -> None:
    """`<name>.png` from a scenario's results document: the 2x load, else the last one run."""
    from .plots import plot_scenario  # matplotlib: only where plots are drawn

    load_name = "2x" if "2x" in document["runs"] else list(document["runs"])[-1]
    plot_scenario(
        name,
        document["scenario"]["description"],
        load_name,
        summaries=document["runs"][load_name],
        series=document["series"][load_name],
        path=RESULTS / f"{name}.png",
        oom_times_s=document.get("oom_times_s", {}).get(load_name),
    )


def redraw_plots() -> None:
    for name in ORDER:
        document = load(name)
        if document is not None:
            plot_document(name, document)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--plots", action="store_true", help="draw the PNGs again from the JSON results")
    parser.add_argument("--readme", action="store_true", help="render the README's table into README.md")
    args = parser.parse_args()
    if args.plots:
        redraw_plots()
    if args.readme:
        README.write_text(rendered(README.read_text()))
        return
    for name, rows in {"README": [*summary_rows(), "", *overhead_sentence()], **docs_tables()}.items():
        print(f"<!-- {name} -->")
        print("\n".join(rows))
        print()


if __name__ == "__main__":
    main()
