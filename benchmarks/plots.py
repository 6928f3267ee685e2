"""One PNG per scenario: limit, in-flight, queued and memory over time, one panel per policy.

Drawn from the same data the JSON results hold, so `python -m benchmarks.report --plots` can draw
them again from committed results.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GiB = 2**30


def plot_scenario(
    name: str,
    description: str,
    load: str,
    summaries: dict[str, dict[str, Any]],
    series: dict[str, list[Any]],
    path: Path,
    oom_times_s: dict[str, list[float]] | None = None,
) -> None:
    statics = [p for p in summaries if p.startswith("static-")]
    best = max(statics, key=lambda p: summaries[p]["goodput_per_s"]) if statics else None
    shown = [p for p in ("adaptive", "oracle", best, "none") if p is not None and p in summaries]
    figure, axes = plt.subplots(len(shown), 1, figsize=(10, 3.0 * len(shown)), sharex=True, squeeze=False)
    for axis, policy in zip(axes[:, 0], shown, strict=True):
        rows = series[policy]
        times = [row[0] for row in rows]
        limits = [row[1] if row[1] is not None and math.isfinite(row[1]) else float("nan") for row in rows]
        in_flight = [row[2] for row in rows]
        axis.step(times, limits, where="post", label="limit", color="tab:blue", linewidth=2)
        axis.plot(times, in_flight, label="in flight", color="tab:green", alpha=0.8)
        for oom_s in (oom_times_s or {}).get(policy, []):
            axis.axvline(oom_s, color="tab:red", alpha=0.3, linewidth=1)
        top = max([v for v in limits if not math.isnan(v)] + in_flight + [1])
        axis.set_ylim(0, top + 2)
        axis.set_ylabel("limit, in flight")
        queue_axis = axis.twinx()
        queue_axis.spines["right"].set_position(("axes", 1.09))
        queue_axis.fill_between(times, [row[3] for row in rows], color="tab:orange", alpha=0.15, label="queued")
        queue_axis.set_ylabel("queued", color="tab:orange")
        memory_axis = axis.twinx()
        memory_axis.plot(times, [row[4] / GiB for row in rows], color="tab:purple", alpha=0.6, label="GiB used")
        memory_axis.set_ylabel("GiB used", color="tab:purple")
        memory_axis.set_ylim(0, 26)
        summary = summaries[policy]
        axis.set_title(
            f"{policy}: {summary['goodput_per_s']} good/s, {summary['ooms']} OOMs, {summary['rejected_503']} 503s",
            fontsize=10,
        )
        handles = [
            *axis.get_legend_handles_labels()[0],
            *queue_axis.get_legend_handles_labels()[0],
            *memory_axis.get_legend_handles_labels()[0],
        ]
        axis.legend(handles=handles, loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds")
    figure.suptitle(f"{name} at {load}: {description}", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
