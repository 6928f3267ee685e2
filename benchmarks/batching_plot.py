"""The batch size following the card: `benchmarks/results/batching.png`, drawn from `batching.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_batching(document: dict[str, Any], path: Path) -> None:
    scenarios = list(document["series"])
    figure, axes = plt.subplots(len(scenarios), 1, figsize=(10, 3.2 * len(scenarios)), sharex=True, squeeze=False)
    for axis, scenario in zip(axes[:, 0], scenarios, strict=True):
        rows = document["series"][scenario]
        times = [row[0] for row in rows]
        axis.step(times, [row[1] for row in rows], where="post", color="tab:blue", linewidth=1.5,
                  label="adaptive: items in the batch")  # fmt: skip
        axis.set_ylabel("items per batch")
        axis.set_ylim(0, max(row[1] for row in rows) + 4)
        free_axis = axis.twinx()
        free_axis.plot(times, [row[2] for row in rows], color="tab:purple", alpha=0.6, label="GiB free beside weights")
        free_axis.set_ylabel("GiB free", color="tab:purple")
        free_axis.set_ylim(0, 20)
        runs = document["runs"][scenario]
        fixed = {p: s["goodput_per_s"] for p, s in runs.items() if p.startswith("fixed-")}
        best = max(fixed, key=lambda p: fixed[p])
        axis.set_title(
            f"{scenario}: adaptive {runs['adaptive']['goodput_per_s']}/s, best fixed ({best}) {fixed[best]}/s, "
            f"{runs['adaptive']['splits']} splits, {runs['adaptive']['failed_by_oom']} failed by OOM",
            fontsize=10,
        )
        handles = axis.get_legend_handles_labels()[0] + free_axis.get_legend_handles_labels()[0]
        axis.legend(handles=handles, loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("virtual seconds")
    figure.suptitle(f"Batch size following the card ({document['command']})", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
