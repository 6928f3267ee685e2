"""Sustained overload in two pictures: `benchmarks/results/overload.png`.

    python -m benchmarks.overload_plot [--http PATH ...] [--duration-s S] [--seed N] [--out PATH]

Above, on virtual time (`benchmarks.overload`'s card: 4 at once, 50 ms, 1 s deadlines): how fresh
the answers are under each `overload` mode at 2x and 4x capacity, as the share of successes
answered within so many milliseconds. All three keep the card at capacity (the deadline that
includes the work stops the waste); they differ in how late the served are. Below, over HTTP: the
goodput of each policy in front of the demo service, from `benchmarks.http_demo` JSON documents
(one group of bars per document), with how many of each policy's clients gave up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .overload import DEADLINE_S, Flow, Replay, capacity_per_s  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MODES = ("lifo", "shed", "off")


def latencies_ms(factor: float, mode: str, duration_s: float, seed: int) -> list[float]:
    [result] = Replay([Flow(factor * capacity_per_s())], overload=mode, seed=seed).run(duration_s)
    return sorted(1000 * latency_s for latency_s in result.latencies_s)


def plot(http_documents: list[dict[str, Any]], path: Path, *, duration_s: float, seed: int) -> None:
    rows = 2 if http_documents else 1
    figure = plt.figure(figsize=(11, 4 * rows))
    for column, factor in enumerate((2, 4)):
        axis = figure.add_subplot(rows, 2, column + 1)
        for mode in MODES:
            answered_ms = latencies_ms(factor, mode, duration_s, seed)
            shares = [(index + 1) / len(answered_ms) for index in range(len(answered_ms))]
            axis.plot(answered_ms, shares, label=f"overload={mode!r}")
        axis.axvline(DEADLINE_S * 1000, color="grey", linestyle=":", label="the clients' deadline")
        axis.set_title(f"{factor}x capacity, virtual time: how fresh the answers are", fontsize=10)
        axis.set_xlabel("ms from arrival to answer (successes)")
        axis.set_ylabel("share of successes")
        axis.legend(fontsize=8, loc="lower right")
    if http_documents:
        axis = figure.add_subplot(rows, 1, 2)
        policies = list(http_documents[0]["runs"]["classic"])
        width = 0.8 / len(http_documents)
        for index, document in enumerate(http_documents):
            runs = document["runs"]["classic"]
            goodput = [runs[p]["goodput_per_s"] if p in runs else 0 for p in policies]
            positions = [i + index * width for i in range(len(policies))]
            bars = axis.bar(
                positions, goodput, width, label=f"run {index + 1}: {document['rate_per_s']:.1f} req/s offered"
            )
            for bar, policy in zip(bars, policies, strict=True):
                gave_up = runs.get(policy, {}).get("gave_up", 0)
                axis.annotate(f"{gave_up} gave up", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                              ha="center", va="bottom", fontsize=7)  # fmt: skip
        axis.set_xticks([i + width * (len(http_documents) - 1) / 2 for i in range(len(policies))], policies)
        first = http_documents[0]
        axis.set_ylabel(f"answers within {first.get('deadline_s', 10):.0f} s per second")
        axis.set_title(f"the demo over HTTP for {first['duration_s']:.0f} s: goodput", fontsize=10)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--http", type=Path, action="append", default=[], help="an http_demo JSON document")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS / "overload.png")
    args = parser.parse_args()
    documents = [json.loads(path.read_text()) for path in args.http]
    plot(documents, args.out, duration_s=args.duration_s, seed=args.seed)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
