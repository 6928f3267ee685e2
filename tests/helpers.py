"""What several test modules share: a gated app with a route held until released, a client, a poll,
the metrics parsed back, an image, and the real-time scenario's app and load. Test modules import
from here (and from `asgi_helpers`, `servers`), never from one another."""

from __future__ import annotations

import contextlib
import gc
import io
import statistics
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
from fastapi import FastAPI
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from adaptive_gate import AIMD, AdaptiveGate
from adaptive_gate.testing import SimulatedGPU

GiB = 2**30
CARD = 24 * GiB


def find_gate(app: Any) -> AdaptiveGate:
    """The gate inside a Starlette/FastAPI app's middleware stack (built at its first call)."""
    node = getattr(app, "middleware_stack", None) or app
    while node is not None:
        if isinstance(node, AdaptiveGate):
            return node
        node = getattr(node, "app", None)
    raise LookupError("no AdaptiveGate in this app's middleware stack (has it been called yet?)")


class Held:
    """A gated route that runs until released, counting how many run at once."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.go = anyio.Event()
        self.entered = 0

    async def __call__(self) -> dict[str, int]:
        self.running += 1
        self.entered += 1
        self.peak = max(self.peak, self.running)
        try:
            await self.go.wait()
        finally:
            self.running -= 1
        return {"peak": self.peak}


def gated_app(**options: Any) -> tuple[FastAPI, Held]:
    held = Held()
    app = FastAPI()
    options.setdefault("probe", None)
    app.add_middleware(AdaptiveGate, **options)
    app.add_api_route("/work", held, methods=["POST"], tags=["gpu"])

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app, held


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test", timeout=30)


async def wait_until(predicate: Any, timeout_s: float = 30.0) -> None:
    """Poll until `predicate` holds. The timeout only catches a hang: a busy machine may take long."""

    def holds() -> bool:
        try:
            return bool(predicate())
        except LookupError:  # the middleware stack is built by the first call, which may not have run yet
            return False

    with anyio.fail_after(timeout_s):
        while not holds():  # noqa: ASYNC110 - polls state owned by the code under test
            await anyio.sleep(0.002)


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition: (name, sorted labels) -> value."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (64, 48), mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, 128).save(buffer, format=fmt)
    return buffer.getvalue()


# -- the real-time scenarios: a classic app on a simulated card, and closed-loop load -------------


def classic_app(gpu: SimulatedGPU, request_bytes: list[int]) -> FastAPI:
    # Requests last 30 ms instead of 100, and the sampler reads every 10 ms to match, so that seconds
    # of real time show what minutes show in production.
    controller = AIMD(oom_hold_s=6.0)
    app = FastAPI()
    app.add_middleware(
        AdaptiveGate, probe=gpu, controller=controller, sample_period=0.01, queue_timeout=10, max_queue=256
    )

    @app.post("/infer", tags=["gpu"])
    def infer() -> dict[str, bool]:
        with gpu.holding(request_bytes[0], work_s=0.03):
            pass
        return {"ok": True}

    return app


async def hammer(app: FastAPI, seconds: float, clients: int = 12) -> tuple[dict[int, int], float]:
    """Closed-loop clients for `seconds`; returns the answers and the median limit of the second half."""
    codes: dict[int, int] = {}
    started = anyio.current_time()
    stop_at = started + seconds
    limits: list[int] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while anyio.current_time() < stop_at:
            response = await client.post("/infer")
            codes[response.status_code] = codes.get(response.status_code, 0) + 1
            if response.status_code == 503:
                await anyio.sleep(0.01)

    async def watch() -> None:
        await anyio.sleep(seconds / 2)
        while anyio.current_time() < stop_at:
            limits.append(find_gate(app).statistics().limit)
            await anyio.sleep(0.05)

    with frozen_heap():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t", timeout=30) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                for _ in range(clients):
                    tg.start_soon(client_loop, client)
    return codes, statistics.median(limits)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Whatever earlier tests left on the heap (models, apps: some 240,000 objects a third of the way
    through the suite) out of the collector's way for a measurement on the real clock: a full
    collection of it stalled the event loop 170 ms, longer than a request's work and the gate's
    sample period, in the middle of a run that was not about stalls."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
