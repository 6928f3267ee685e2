"""`/gate/metrics`: read back with prometheus-client's own parser and checked against the status."""

from __future__ import annotations

from typing import Any

import anyio
import prometheus_client
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI, HTTPException
from prometheus_client.parser import text_string_to_metric_families

from adaptive_gate import AdaptiveGate, Fixed
from adaptive_gate.testing import SimulatedGPU

from .helpers import client_for, find_gate, parse, wait_until

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def busy_app(gpu: SimulatedGPU, **options: Any) -> FastAPI:
    app = FastAPI()
    options.setdefault("controller", Fixed(2))
    app.add_middleware(AdaptiveGate, probe=gpu, sample_period=0.01, max_queue=3, **options)

    @app.post("/work", tags=["gpu"])
    async def work(nbytes: int = 100 * MiB, fail: int = 0) -> dict[str, bool]:
        if fail:
            raise HTTPException(fail, "asked to fail")
        with gpu.allocate(nbytes):
            await anyio.sleep(0.05)
        return {"ok": True}

    return app


async def test_the_exposition_agrees_with_the_status() -> None:
    gpu = SimulatedGPU(1024 * MiB, baseline_bytes=100 * MiB)
    app = busy_app(gpu)
    async with LifespanManager(app), client_for(app) as client:
        async with anyio.create_task_group() as tg:
            for _ in range(8):  # 2 run, 3 wait, 3 turned away: queue full
                tg.start_soon(client.post, "/work")
        await client.post("/work", params={"nbytes": 2048 * MiB})  # never fits: OOM -> 503 too_large
        await client.post("/work", params={"fail": 422})
        # No time for the route's work (50 ms, learned above): turned away even with a slot free... (10 ms, right
        # after an answer: not a request let through to measure the route again, as one is each second)
        await client.post("/work")
        await client.post("/work", headers={"x-envoy-expected-rq-timeout-ms": "10"})
        async with anyio.create_task_group() as tg:  # ...and when it must queue: hold both slots
            tg.start_soon(client.post, "/work")
            tg.start_soon(client.post, "/work")
            await wait_until(lambda: find_gate(app).statistics().in_flight == 2)
            await client.post("/work", headers={"x-envoy-expected-rq-timeout-ms": "10"})
        # No request runs now, so the status and the scrape see the same moment, and an idle reading.
        await wait_until(lambda: find_gate(app).statistics().probe.last_sample.used_bytes == 100 * MiB)  # type: ignore[union-attr]
        status = (await client.get("/gate/status")).json()
        metrics = await client.get("/gate/metrics")
    samples = parse(metrics.text)
    counters = status["counters"]

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("adaptive_gate_limit") == status["limit"] == 2
    assert value("adaptive_gate_in_flight") == status["in_flight"] == 0
    assert value("adaptive_gate_queued") == status["queued"] == 0
    assert value("adaptive_gate_limit_bound", bound="controller") == 1
    assert value("adaptive_gate_limit_bound", bound="memory") == 0
    assert value("adaptive_gate_admitted_total") == counters["admitted"]
    assert value("adaptive_gate_requests_total", outcome="completed") == counters["completed"] >= 7
    assert value("adaptive_gate_requests_total", outcome="failed") == counters["failed"] == 1
    assert value("adaptive_gate_requests_total", outcome="oom") == counters["admitted_ooms"] == 1
    assert value("adaptive_gate_rejections_total", reason="queue_full") == counters["rejected_by_reason"]["queue_full"]
    assert value("adaptive_gate_rejections_total", reason="queue_full") == 3
    # The OOM ran alone (2 GiB on a 1 GiB card): too large for the card, not congestion.
    assert value("adaptive_gate_rejections_total", reason="too_large") == 1
    assert value("adaptive_gate_rejections_total", reason="oom") == 0
    assert value("adaptive_gate_rejections_total", reason="deadline") == counters["rejected_by_reason"]["deadline"] == 2
    assert value("adaptive_gate_requests_total", outcome="rejected") == 5  # queue full and deadline, not the OOM
    ended = sum(value("adaptive_gate_requests_total", outcome=o) for o in ("completed", "failed", "oom"))
    assert ended == counters["admitted"]  # every admitted request ended exactly once
    assert value("adaptive_gate_ooms_total") == counters["ooms"] == 1
    assert value("adaptive_gate_queue_wait_seconds_count") == counters["admitted"]
    assert value("adaptive_gate_service_seconds_count") == counters["completed"]
    assert 0 < value("adaptive_gate_service_seconds_sum") < 60
    assert value("adaptive_gate_service_seconds_bucket", le="0.01") == 0  # each takes 50 ms
    assert value("adaptive_gate_service_seconds_bucket", le="+Inf") == counters["completed"]
    device = status["device"]
    assert device == "SimulatedGPU"
    assert value("adaptive_gate_memory_used_bytes", device=device) == status["memory"]["used_bytes"] == 100 * MiB
    assert value("adaptive_gate_memory_total_bytes", device=device) == 1024 * MiB
    assert value("adaptive_gate_probe_errors_total") == status["probe"]["errors"] == 0
    assert value("adaptive_gate_ready") == 1
    assert value("adaptive_gate_workers") == status["workers"]["count"]
    assert value("adaptive_gate_findings_total", code="shared_gpu") == 0
    assert value("adaptive_gate_info", version=status["version"], controller="fixed", device=device) == 1


async def test_names_follow_the_conventions() -> None:
    app = busy_app(SimulatedGPU(1024 * MiB))
    async with client_for(app) as client:
        await client.post("/work")
        text = (await client.get("/gate/metrics")).text
    families = list(text_string_to_metric_families(text))
    assert len(families) >= 20
    for family in families:
        assert family.name.startswith("adaptive_gate_"), family.name
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created")), sample.name
    units = {family.name for family in families}
    assert {"adaptive_gate_queue_wait_seconds", "adaptive_gate_service_seconds"} <= units


async def test_limit_changes_and_probe_errors_are_counted() -> None:
    class Flaky:
        calls = 0

        def sample(self) -> Any:
            self.calls += 1
            raise OSError("driver went away")

    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=Flaky(), sample_period=0.01, admin_token="t" * 20, unprotected=("metrics",))
    async with LifespanManager(app), client_for(app) as client:
        await client.get("/gate/metrics")
        await wait_until(lambda: find_gate(app).statistics().probe.errors >= 2)
        auth = {"Authorization": "Bearer " + "t" * 20}
        await client.put("/gate/limits", json={"pin": 5}, headers=auth)
        await client.put("/gate/limits", json={"pin": 3}, headers=auth)
        samples = parse((await client.get("/gate/metrics")).text)
        status = (await client.get("/gate/status", headers=auth)).json()
    assert samples[("adaptive_gate_limit_changes_total", (("direction", "up"),))] == 1
    assert samples[("adaptive_gate_limit_changes_total", (("direction", "down"),))] == 1
    assert samples[("adaptive_gate_limit_bound", (("bound", "operator"),))] == 1
    assert samples[("adaptive_gate_probe_errors_total", ())] >= status["probe"]["errors"] - 1 >= 1
    assert samples[("adaptive_gate_probe_healthy", ())] == 0


async def test_two_gates_in_one_process_keep_their_own_metrics() -> None:
    first, second = busy_app(SimulatedGPU(1024 * MiB)), busy_app(SimulatedGPU(1024 * MiB), controller=Fixed(5))
    async with client_for(first) as one, client_for(second) as two:
        for _ in range(3):
            await one.post("/work")
        samples_one = parse((await one.get("/gate/metrics")).text)
        samples_two = parse((await two.get("/gate/metrics")).text)
    assert samples_one[("adaptive_gate_limit", ())] == 2 and samples_two[("adaptive_gate_limit", ())] == 5
    assert samples_one[("adaptive_gate_admitted_total", ())] == 3
    assert samples_two[("adaptive_gate_admitted_total", ())] == 0
    assert find_gate(first).metrics.registry is not find_gate(second).metrics.registry  # type: ignore[union-attr]
    # And the process-wide default registry is left to the application.
    assert prometheus_client.REGISTRY.get_sample_value("adaptive_gate_limit") is None


async def test_a_batchers_controller_shows_as_the_bound_of_the_limit() -> None:
    """With `controller=batched.gate_controller()` the batcher sets the limit; the bound series says so."""
    from adaptive_gate import batch

    @batch(probe=None)
    def double(items: list[int]) -> list[int]:
        return [2 * item for item in items]

    gpu = SimulatedGPU(1024 * MiB)
    app = busy_app(gpu, controller=double.gate_controller())
    async with LifespanManager(app), client_for(app) as client:
        status = (await client.get("/gate/status")).json()
        samples = parse((await client.get("/gate/metrics")).text)
    assert status["bound"] == "batcher"
    assert samples[("adaptive_gate_limit_bound", (("bound", "batcher"),))] == 1
    assert sum(value for (name, _), value in samples.items() if name == "adaptive_gate_limit_bound") == 1
