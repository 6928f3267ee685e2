"""The gate's own cost: a trivial gated route with and without the gate, side by side in one run.

    python -m benchmarks.overhead [--quick]

Three apps: without the gate; with the gate as a user gets it (`AdaptiveGate()`: AIMD, probe
"auto"); and with `Fixed(64)` and `probe=None` (the bookkeeping alone, no queueing).
In process: each request is one direct ASGI call; in each round the apps take turns in a shuffled
order, and the cost is the median over rounds of (the app's median - the plain app's median) in the
same round (target: at most 10 us added). Through uvicorn: one server per app, loaded in
alternating rounds by `wrk` where it is installed (else an httpx client); requests per second are
compared (target: at least 0.95x the plain app's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from adaptive_gate import AdaptiveGate, Fixed

from .environment import environment

RESULTS = Path(__file__).parent / "results"


VARIANTS = ("no gate", "pass-through", "defaults", "fixed")


class PassThrough:
    """A middleware that does nothing: what any pure ASGI middleware costs, the floor to compare with."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def make_app(variant: str) -> FastAPI:
    app = FastAPI()
    if variant == "pass-through":
        app.add_middleware(PassThrough)
    elif variant == "defaults":
        app.add_middleware(AdaptiveGate)
    elif variant == "fixed":
        # A limit far above the load: this measures the gate's bookkeeping, not queueing.
        app.add_middleware(AdaptiveGate, probe=None, controller=Fixed(64))

    @app.get("/work", tags=["gpu"], response_class=PlainTextResponse)
    async def work() -> str:
        return "ok"

    return app


def plain_app() -> FastAPI:  # uvicorn factory
    return make_app("no gate")


def pass_through_app() -> FastAPI:  # uvicorn factory
    return make_app("pass-through")


def defaults_app() -> FastAPI:  # uvicorn factory
    return make_app("defaults")


def fixed_app() -> FastAPI:  # uvicorn factory
    return make_app("fixed")


FACTORIES = {
    "no gate": "plain_app",
    "pass-through": "pass_through_app",
    "defaults": "defaults_app",
    "fixed": "fixed_app",
}


async def _time_calls(app: FastAPI, n: int) -> list[float]:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": "/work", "raw_path": b"/work", "root_path": "", "query_string": b"", "headers": [(b"host", b"x")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    times = []
    for _ in range(n):
        started = time.perf_counter_ns()
        await app(dict(scope), receive, send)
        times.append((time.perf_counter_ns() - started) / 1000)
    return times


def in_process(rounds: int, per_round: int) -> dict[str, Any]:
    apps = {name: make_app(name) for name in VARIANTS}
    medians: dict[str, list[float]] = {name: [] for name in apps}
    rng = random.Random(0)

    async def run() -> None:
        for app in apps.values():
            await _time_calls(app, 500)  # warm-up: build the middleware stacks, fill caches
        for _ in range(rounds):
            order = list(apps)
            rng.shuffle(order)
            for name in order:
                medians[name].append(statistics.median(await _time_calls(apps[name], per_round)))

    asyncio.run(run())
    plain = medians["no gate"]
    result: dict[str, Any] = {"median_us_no_gate": statistics.median(plain), "rounds": rounds}
    for name in ("pass-through", "defaults", "fixed"):
        result[f"median_us_{name}"] = statistics.median(medians[name])
        result[f"added_us_{name}"] = statistics.median(m - p for m, p in zip(medians[name], plain, strict=True))
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(factory: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", f"benchmarks.overhead:{factory}", "--port", str(port),
         "--host", "127.0.0.1", "--log-level", "warning", "--no-access-log"],
        cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process, url
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"uvicorn ({factory}) did not start")


def load(url: str, seconds: float, connections: int) -> tuple[float, int]:
    """Requests per second that `url`/work sustained, and how many requests that was."""
    if shutil.which("wrk"):
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", f"{url}/work"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
        count = re.search(r"(\d+) requests in", out)
        assert rate and count, out
        return float(rate.group(1)), int(count.group(1))
    per_s = asyncio.run(_httpx_load(url, seconds, connections))
    return per_s, round(per_s * seconds)


def cpu_s(pid: int) -> float:
    """The CPU time a process has used (user + system): steal and other tenants' load not counted."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _httpx_load(url: str, seconds: float, connections: int) -> float:
    import httpx

    done = 0
    stop_at = time.monotonic() + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            await client.get(f"{url}/work")
            done += 1

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=connections)) as client:
        await asyncio.gather(*(worker(client) for _ in range(connections)))
    return done / seconds


def through_uvicorn(rounds: int, seconds: float, connections: int) -> dict[str, Any]:
    """Alternating rounds; each variant's figure is the median over rounds of its ratio to the plain
    app's in the same round (drift over the run cancels), in requests/s and in server CPU per request."""
    servers = {name: start_server(factory) for name, factory in FACTORIES.items()}
    rates: dict[str, list[float]] = {name: [] for name in servers}
    cpu_us: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for _, url in servers.values():
            load(url, 1, connections)  # warm-up
        order = list(servers)
        for _ in range(rounds):
            for name in order:  # the order reversed each round, so that drift over the run favours none
                process, url = servers[name]
                cpu_before_s = cpu_s(process.pid)
                rate, count = load(url, seconds, connections)
                rates[name].append(rate)
                cpu_us[name].append((cpu_s(process.pid) - cpu_before_s) / count * 1e6)
            order.reverse()
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGINT)
            process.wait(10)
    result: dict[str, Any] = {
        "rps_by_round": rates,
        "server_cpu_us_per_request_by_round": cpu_us,
        "rps_no_gate": statistics.median(rates["no gate"]),
        "cpu_us_no_gate": statistics.median(cpu_us["no gate"]),
        "client": "wrk" if shutil.which("wrk") else "httpx",
        "rounds": rounds,
    }
    for name in ("pass-through", "defaults", "fixed"):
        result[f"rps_{name}"] = statistics.median(rates[name])
        result[f"ratio_{name}"] = statistics.median(r / p for r, p in zip(rates[name], rates["no gate"], strict=True))
        result[f"cpu_us_{name}"] = statistics.median(cpu_us[name])
        result[f"cpu_ratio_{name}"] = statistics.median(
            p / c for c, p in zip(cpu_us[name], cpu_us["no gate"], strict=True)
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    args = parser.parse_args()
    rounds = 4 if args.quick else 10
    process = in_process(rounds=rounds * 5, per_round=1000 if args.quick else 2000)
    for name in ("pass-through", "defaults", "fixed"):
        print(
            f"in process, {name}: median {process['median_us_no_gate']:.1f} us without the gate, "
            f"{process[f'median_us_{name}']:.1f} us with it: {process[f'added_us_{name}']:+.1f} us per request "
            "(median of paired rounds; target <= 10)"
        )
    served = through_uvicorn(rounds=rounds, seconds=3 if args.quick else 5, connections=16)
    for name in ("pass-through", "defaults", "fixed"):
        print(
            f"through uvicorn ({served['client']} -c16), {name}: {served['rps_no_gate']:.0f} req/s without the gate, "
            f"{served[f'rps_{name}']:.0f} with it: {served[f'ratio_{name}']:.3f}x (target >= 0.95); server CPU "
            f"{served['cpu_us_no_gate']:.0f} -> {served[f'cpu_us_{name}']:.0f} us per request: "
            f"{served[f'cpu_ratio_{name}']:.3f}x the requests per CPU-second"
        )
    RESULTS.mkdir(exist_ok=True)
    command = "python -m benchmarks.overhead" + (" --quick" if args.quick else "")
    result = {"environment": environment(), "command": command, "cpus": os.cpu_count(),
              "in_process": process, "uvicorn": served}  # fmt: skip
    (RESULTS / "overhead.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
