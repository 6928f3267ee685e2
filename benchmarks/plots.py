"""One PNG per scenario: limit, in-flight, queued and memory over time, one panel per policy."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

if TYPE_CHECKING:
    from .harness import RunResult

GiB = 2**30


def plot_scenario(name: str, description: str, load: str, by_policy: dict[str, RunResult], path: Path) -> None:
    statics = {p: r for p, r in by_policy.items() if p.startswith("static-")}
    best = max(statics, key=lambda p: statics[p].summary()["goodput_per_s"]) if statics else None
    shown = [p for p in ("adaptive", best, "none") if p is not None and p in by_policy]
    figure, axes = plt.subplots(len(shown), 1, figsize=(10, 3.2 * len(shown)), sharex=True, squeeze=False)
    for axis, policy in zip(axes[:, 0], shown, strict=True):
        result = by_policy[policy]
        series = result.series
        times = [row[0] for row in series]
        limits = [row[1] if math.isfinite(row[1]) else float("nan") for row in series]
        axis.step(times, limits, where="post", label="limit", color="tab:blue", linewidth=2)
        axis.plot(times, [row[2] for row in series], label="in flight", color="tab:green", alpha=0.8)
        axis.plot(times, [row[3] for row in series], label="queued", color="tab:orange", alpha=0.8)
        for oom_s in result.oom_times_s:
            axis.axvline(oom_s, color="tab:red", alpha=0.25, linewidth=1)
        axis.set_ylabel("requests")
        summary = result.summary()
        axis.set_title(f"{policy}: {summary['goodput_per_s']} good/s, {summary['ooms']} OOMs, "
                       f"{summary['rejected_503']} 503s (red lines: OOMs)", fontsize=10)  # fmt: skip
        memory_axis = axis.twinx()
        memory_axis.plot(times, [row[4] / GiB for row in series], color="tab:purple", alpha=0.5, label="memory")
        memory_axis.set_ylabel("GiB used", color="tab:purple")
        memory_axis.set_ylim(0, 26)
        handles = axis.get_legend_handles_labels()[0] + memory_axis.get_legend_handles_labels()[0]
        axis.legend(handles=handles, loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds")
    figure.suptitle(f"{name} at {load}: {description}", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
