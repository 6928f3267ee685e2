"""The gate's own cost: a trivial gated route with and without the gate, side by side in one run.

    python -m benchmarks.overhead [--quick]

In process: each request is one direct ASGI call; the two apps are measured in alternating rounds
and the median per-request time of each is compared (target: at most 30 us added).
Through uvicorn: two servers, one gated, one not, loaded in alternating rounds by `wrk` where it is
installed (else an httpx client); requests per second are compared (target: at most 5% lost).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

RESULTS = Path(__file__).parent / "results"


def make_app(gated: bool) -> FastAPI:
    app = FastAPI()
    if gated:
        # A limit far above the load: this measures the gate's bookkeeping, not queueing.
        app.add_middleware(AdaptiveGate, probe=None, controller=Fixed(64))

    @app.get("/work", tags=["gpu"], response_class=PlainTextResponse)
    async def work() -> str:
        return "ok"

    return app


def gated_app() -> FastAPI:  # uvicorn factory
    return make_app(True)


def plain_app() -> FastAPI:  # uvicorn factory
    return make_app(False)


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


def in_process(rounds: int, per_round: int) -> dict[str, float]:
    apps = {"gate": make_app(True), "no gate": make_app(False)}
    samples: dict[str, list[float]] = {name: [] for name in apps}

    async def run() -> None:
        for app in apps.values():
            await _time_calls(app, 500)  # warm-up: build the middleware stacks, fill caches
        for _ in range(rounds):
            for name, app in apps.items():
                samples[name] += await _time_calls(app, per_round)

    asyncio.run(run())
    gate_us, plain_us = statistics.median(samples["gate"]), statistics.median(samples["no gate"])
    return {"median_us_gate": gate_us, "median_us_no_gate": plain_us, "added_us": gate_us - plain_us}


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


def load(url: str, seconds: float, connections: int) -> float:
    """Requests per second that `url`/work sustained."""
    if shutil.which("wrk"):
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", f"{url}/work"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        match = re.search(r"Requests/sec:\s+([\d.]+)", out)
        assert match, out
        return float(match.group(1))
    return asyncio.run(_httpx_load(url, seconds, connections))


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


def url_of(servers: dict[str, tuple[subprocess.Popen[bytes], str]], name: str) -> str:
    return servers[name][1]


def through_uvicorn(rounds: int, seconds: float, connections: int) -> dict[str, float]:
    servers = {"gate": start_server("gated_app"), "no gate": start_server("plain_app")}
    rates: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for _, url in servers.values():
            load(url, 1, connections)  # warm-up
        order = list(servers)
        for _ in range(rounds):
            for name in order:  # ABBA order, so that drift over the run favours neither
                rates[name].append(load(url_of(servers, name), seconds, connections))
            order.reverse()
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGINT)
            process.wait(10)
    gate_rps, plain_rps = statistics.median(rates["gate"]), statistics.median(rates["no gate"])
    return {
        "rps_by_round": rates,
        "rps_gate": gate_rps,
        "rps_no_gate": plain_rps,
        "ratio": gate_rps / plain_rps,
        "client": "wrk" if shutil.which("wrk") else "httpx",
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    args = parser.parse_args()
    rounds = 4 if args.quick else 10
    process = in_process(rounds=rounds, per_round=2000 if args.quick else 5000)
    print(
        f"in process: median {process['median_us_no_gate']:.1f} us without the gate, "
        f"{process['median_us_gate']:.1f} us with it: {process['added_us']:+.1f} us per request (target <= 30)"
    )
    served = through_uvicorn(rounds=rounds, seconds=3 if args.quick else 5, connections=32)
    print(
        f"through uvicorn ({served['client']}): {served['rps_no_gate']:.0f} req/s without the gate, "
        f"{served['rps_gate']:.0f} with it: {served['ratio']:.3f}x (target >= 0.95)"
    )
    RESULTS.mkdir(exist_ok=True)
    result = {"command": "python -m benchmarks.overhead" + (" --quick" if args.quick else ""), "cpus": os.cpu_count(),
              "in_process": process, "uvicorn": served}  # fmt: skip
    (RESULTS / "overhead.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
