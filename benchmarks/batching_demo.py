"""`python -m benchmarks.batching_demo`: the demo's goodput with `--batching on` against `off`.

Each setting runs as its own `python -m demo_service --batching ...` process on 127.0.0.1 (by
default the CPU and the simulated card; `--device cuda` where a GPU is lent; the gate in front),
measured closed loop: `--connections` clients each
send their next image when the last is answered, for `--duration-s` after a warm-up. The settings
alternate (on, off, on, off, ...) so that a neighbour's load on a shared machine falls on both
alike; the goodput of each is the mean of its rounds. On the 2-core CPU, ResNet-50 gained nothing
from batches when measured by hand, so the target is not to lose: on >= 0.95x off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path
from typing import Any

from .environment import environment
from .http_demo import Service, closed_loop

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batching_demo", description=__doc__)
    parser.add_argument("--model", default="efficientnet-lite0", help="the demo's --model")
    parser.add_argument("--device", default="cpu", help="the demo's --device (cpu, or cuda where a GPU is lent)")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    goodput: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(args.rounds):
        for setting in ("on", "off"):
            service = Service("adaptive", ["--device", args.device, "--model", args.model, "--batching", setting])
            try:
                service.wait_ready()
                asyncio.run(closed_loop(service, args.connections, args.warmup_s))
                goodput[setting].append(asyncio.run(closed_loop(service, args.connections, args.duration_s)))
            finally:
                service.stop()
            print(f"  batching {setting:3}: {goodput[setting][-1]:.2f} good/s", flush=True)
    on, off = statistics.mean(goodput["on"]), statistics.mean(goodput["off"])
    ratio = on / off if off else float("inf")
    verdict = "MET   " if ratio >= 0.95 else "MISSED"
    print(f"{verdict} demo on {args.device} ({args.model}): --batching on {on:.2f}/s vs off {off:.2f}/s = {ratio:.2f}x "
          "(target >= 0.95)")  # fmt: skip
    document: dict[str, Any] = {
        "environment": environment(),
        "command": "python -m benchmarks.batching_demo "
        f"--device {args.device} --model {args.model} --rounds {args.rounds}",
        "machine": {"cpus": os.cpu_count(), "device": args.device},
        "model": args.model,
        "connections": args.connections,
        "duration_s": args.duration_s,
        "goodput_per_s": goodput,
        "ratio": round(ratio, 3),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"batching_demo-{args.device}-{args.model}.json").write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
