"""The policies in front of the demo service, over real HTTP through uvicorn.

    python -m benchmarks.http_demo [--quick] [--device cpu|cuda] [--out DIR] [--vram-fraction F]
        [--model M] [--scenarios a,b] [--policies none,static:2,adaptive] [--duration-s S] [--budget-s S]

Each policy runs as its own `python -m demo_service --policy ...` process on 127.0.0.1; clients are
httpx (open loop, Poisson, with the deadline in `x-envoy-expected-rq-timeout-ms`) and, for the
classic scenario, `wrk` (closed loop) where it is installed. Scenarios: classic (single images),
growth (pairs of images from half-way: memory per request doubles), mixed (a quarter are batches
of three), neighbour (another process takes a share of the card for the middle third; only on the
simulated card, through the demo's control route).

The capacity that sets the open loop's rate is measured closed loop (`--capacity-connections`
clients, each sending its next request when the last is answered), so it is what the card serves
whatever the offered load; the open loop then offers twice that. The JSON is written after every
run: a run killed part-way (the GPU script's time limit) keeps what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from adaptive_gate.status import percentiles_ms

from .environment import environment

RESULTS = Path(__file__).parent / "results"
DEADLINE_S = 10.0


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (256, 256), (seed * 37 % 255, seed * 91 % 255, 128)).save(buffer, format="PNG")
    return buffer.getvalue()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    def __init__(self, policy: str, extra: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "demo_service", "--port", str(self.port), "--policy", policy, *extra]
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        cwd=Path(__file__).parent.parent)  # fmt: skip

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"demo_service exited: {self.output()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError("demo_service did not start in time")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


async def closed_loop(service: Service, connections: int, duration_s: float) -> float:
    """Requests served per second by `connections` clients that each wait for their answer."""
    image = png(3)
    served = 0
    stop_at = time.monotonic() + duration_s

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal served
        while time.monotonic() < stop_at:
            try:
                response = await client.post("/predict", files={"file": ("c.png", image, "image/png")})
            except httpx.HTTPError:
                continue
            served += response.status_code == 200 and time.monotonic() <= stop_at

    async with httpx.AsyncClient(base_url=service.url, timeout=DEADLINE_S,
                                 limits=httpx.Limits(max_connections=connections)) as client:  # fmt: skip
        await asyncio.gather(*(client_loop(client) for _ in range(connections)))
    return served / duration_s


async def open_loop(
    service: Service, scenario: str, rate_per_s: float, duration_s: float, deadline_s: float = DEADLINE_S
) -> dict[str, Any]:
    rng = random.Random(7)
    images = [png(i) for i in range(8)]
    outcome: dict[str, Any] = {"sent": 0, "ok": 0, "good": 0, "503": 0, "500": 0, "other": 0, "gave_up": 0,
                               "latencies_s": [], "reject_s": []}  # fmt: skip
    headers = {"x-envoy-expected-rq-timeout-ms": str(int(deadline_s * 1000))}
    limits: list[tuple[float, Any]] = []
    async with httpx.AsyncClient(base_url=service.url, timeout=deadline_s,
                                 limits=httpx.Limits(max_connections=500)) as client:  # fmt: skip
        started = time.monotonic()
        stop_at = started + duration_s
        neighbour_set = neighbour_cleared = False

        async def one() -> None:
            elapsed = time.monotonic() - started
            outcome["sent"] += 1
            batch = 1
            if scenario == "growth" and elapsed > duration_s / 2:
                batch = 2
            elif scenario == "mixed" and rng.random() < 0.25:
                batch = 3
            path = "/predict" if batch == 1 else "/predict/batch"
            field = "file" if batch == 1 else "files"
            files = [(field, (f"{i}.png", images[rng.randrange(len(images))], "image/png")) for i in range(batch)]
            t0 = time.monotonic()
            try:
                response = await client.post(path, files=files, headers=headers)
            except httpx.HTTPError:
                outcome["gave_up"] += 1
                return
            took = time.monotonic() - t0
            if response.status_code == 200:
                outcome["ok"] += 1
                outcome["latencies_s"].append(took)
                outcome["good"] += took <= deadline_s and time.monotonic() <= stop_at
            elif response.status_code in (429, 503):
                outcome["503"] += 1
                outcome["reject_s"].append(took)
            elif response.status_code >= 500:
                outcome["500"] += 1
            else:
                outcome["other"] += 1

        async def watch() -> None:
            while time.monotonic() < stop_at + 2:
                try:
                    status = (await client.get("/gate/status", timeout=2)).json()
                    limits.append((round(time.monotonic() - started, 2), status.get("limit")))
                except (httpx.HTTPError, ValueError):
                    pass
                await asyncio.sleep(0.25)

        tasks = [asyncio.create_task(watch())]
        next_s = time.monotonic()
        while True:
            next_s += rng.expovariate(rate_per_s)
            if next_s >= stop_at:
                break
            now = time.monotonic()
            if scenario == "neighbour" and not neighbour_set and now - started > duration_s / 3:
                await client.put("/simulated-gpu/neighbour", params={"nbytes": NEIGHBOUR_BYTES})
                neighbour_set = True
            if scenario == "neighbour" and not neighbour_cleared and now - started > 2 * duration_s / 3:
                await client.put("/simulated-gpu/neighbour", params={"nbytes": 0})
                neighbour_cleared = True
            await asyncio.sleep(max(0.0, next_s - time.monotonic()))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    latencies = sorted(outcome.pop("latencies_s"))
    rejects = outcome.pop("reject_s")

    latency = percentiles_ms(latencies, digits=0) or {}

    return {
        **outcome,
        "goodput_per_s": round(outcome["good"] / duration_s, 2),
        "p50_ms": latency.get("p50"), "p95_ms": latency.get("p95"), "p99_ms": latency.get("p99"),
        "reject_answer_ms_mean": round(sum(rejects) / len(rejects) * 1000, 1) if rejects else None,
        "limit_over_time": [row for row in limits if row[1] is not None],
    }  # fmt: skip


NEIGHBOUR_BYTES = 276 * 2**20  # two images' worth of the default 768 MiB simulated card


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "multipart/form-data; boundary=BOUNDARY"
local f = io.open(os.getenv("WRK_BODY"), "rb")
wrk.body = f:read("*all")
f:close()
"""


def wrk_closed_loop(service: Service, seconds: float, connections: int) -> dict[str, Any] | None:
    if not shutil.which("wrk"):
        return None
    with tempfile.TemporaryDirectory() as folder:
        body = (b"--BOUNDARY\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n"
                b"Content-Type: image/png\r\n\r\n" + png(1) + b"\r\n--BOUNDARY--\r\n")  # fmt: skip
        (Path(folder) / "body").write_bytes(body)
        (Path(folder) / "post.lua").write_text(WRK_SCRIPT)
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds:.0f}s", "--latency", "--timeout", f"{DEADLINE_S:.0f}s",
             "-s", str(Path(folder) / "post.lua"), f"{service.url}/predict"],
            capture_output=True, text=True, env={**os.environ, "WRK_BODY": str(Path(folder) / "body")},
        ).stdout  # fmt: skip
    total = re.search(r"(\d+) requests in", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    if not total:
        return {"raw": out}
    failed = int(non2xx.group(1)) if non2xx else 0
    unit = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    return {
        "requests": int(total.group(1)),
        "non_2xx": failed,
        "goodput_per_s": round((int(total.group(1)) - failed) / seconds, 2),
        "p99_ms_all": round(float(p99.group(1)) * unit[p99.group(2)]) if p99 else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vram-fraction", type=float)
    parser.add_argument("--simulated-vram", help="passed to the demo: the simulated card's size without a GPU")
    parser.add_argument("--model", help="passed to the demo (default: the demo's own)")
    parser.add_argument("--image-side", type=int, help="passed to the demo: bigger inputs, more memory per image")
    parser.add_argument("--rate", type=float, help="arrivals per second (default: 2x a measured capacity)")
    parser.add_argument("--scenarios", help="comma-separated (default: classic,growth,mixed and, on cpu, neighbour)")
    parser.add_argument("--policies", help="comma-separated (default: none, a static sweep, adaptive)")
    parser.add_argument("--duration-s", type=float, help="seconds per run (default: 30, 12 with --quick)")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S, help="the clients' deadline per request")
    parser.add_argument("--capacity-policy", default="static:4", help="the policy the capacity is measured with")
    parser.add_argument("--capacity-connections", type=int, default=16)
    parser.add_argument("--capacity-s", type=float, default=6.0)
    parser.add_argument("--budget-s", type=float, help="start no run that would end after this many seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def demo_flags(args: argparse.Namespace) -> list[str]:
    extra = ["--device", args.device]
    for flag, value in (("--vram-fraction", args.vram_fraction), ("--simulated-vram", args.simulated_vram),
                        ("--model", args.model), ("--image-side", args.image_side)):  # fmt: skip
        if value:
            extra += [flag, str(value)]
    return extra


def measure_rate(args: argparse.Namespace, extra: list[str]) -> float:
    """Twice the capacity, measured closed loop: an offered load that saturates the card."""
    if args.rate is not None:
        return float(args.rate)
    service = Service(args.capacity_policy, extra)
    try:
        service.wait_ready()
        capacity = asyncio.run(closed_loop(service, args.capacity_connections, args.capacity_s))
    finally:
        service.stop()
    print(f"capacity with {args.capacity_policy}, {args.capacity_connections} closed-loop clients: "
          f"{capacity:.1f} req/s; open loop at {2 * capacity:.1f} req/s (2x)", flush=True)  # fmt: skip
    return max(1.0, 2 * capacity)


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    args = parse_args(argv)
    duration_s = args.duration_s or (12.0 if args.quick else 30.0)
    extra = demo_flags(args)
    statics = ["static:2", "static:4"] if args.quick else ["static:1", "static:2", "static:3", "static:4", "static:6"]
    policies = args.policies.split(",") if args.policies else ["none", *statics, "adaptive"]
    default_scenarios = ["classic", "growth", "mixed"] + (["neighbour"] if args.device == "cpu" else [])
    scenarios = args.scenarios.split(",") if args.scenarios else default_scenarios
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "http_demo.json"
    document: dict[str, Any] = {
        "environment": environment(),
        "command": " ".join(["python -m benchmarks.http_demo", *sys.argv[1:]]),
        "complete": False,
        "duration_s": duration_s,
        "deadline_s": args.deadline_s,
        "runs": {},
        "skipped": [],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    document["rate_per_s"] = rate = measure_rate(args, extra)
    run_s = 0.0  # the longest run so far, start-up included: what the budget must still hold
    for scenario in scenarios:
        document["runs"].setdefault(scenario, {})
        for policy in policies:
            elapsed_s = time.monotonic() - started
            if args.budget_s is not None and elapsed_s + max(run_s, duration_s) > args.budget_s:
                document["skipped"].append(f"{scenario}/{policy}: out of time at {elapsed_s:.0f} s")
                continue
            run_started = time.monotonic()
            result = one_run(scenario, policy, extra, rate, duration_s, args.deadline_s)
            run_s = max(run_s, time.monotonic() - run_started)
            document["runs"][scenario][policy] = result
            path.write_text(json.dumps(document, indent=1) + "\n")  # after every run: a kill keeps them
            print_run(scenario, policy, result)
    document["complete"] = not document["skipped"]
    path.write_text(json.dumps(document, indent=1) + "\n")


def one_run(scenario: str, policy: str, extra: list[str], rate: float, duration_s: float,
            deadline_s: float) -> dict[str, Any]:  # fmt: skip
    """One policy against one scenario, on its own demo process; a failure is recorded, not raised."""
    service = Service(policy, extra)
    try:
        service.wait_ready()
        result = asyncio.run(open_loop(service, scenario, rate, duration_s, deadline_s))
        if scenario == "classic":
            result["wrk_closed_loop_16"] = wrk_closed_loop(service, min(duration_s, 15), 16)
        return result
    except Exception as exc:
        return {"error": repr(exc), "service_output": service.output()}
    finally:
        service.stop()


def print_run(scenario: str, policy: str, result: dict[str, Any]) -> None:
    if "error" in result:
        print(f"{scenario:10} {policy:10} failed: {result['error']}", flush=True)
        return
    wrk = result.get("wrk_closed_loop_16") or {}
    print(f"{scenario:10} {policy:10} goodput {result['goodput_per_s']:6}/s p99 {result['p99_ms']} ms "
          f"503s {result['503']:4} 500s {result['500']:4} gave up {result['gave_up']:4}"
          + (f" | wrk goodput {wrk.get('goodput_per_s')}/s" if wrk else ""), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
