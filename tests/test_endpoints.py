"""The gate's own endpoints: where they live, who may read them, readiness, and limits set at run time."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anyio
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from adaptive_gate import AIMD, AdaptiveGate, Fixed, MemorySample

from .helpers import Held, client_for, find_gate, gated_app, wait_until

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_every_endpoint_answers_at_its_default_path() -> None:
    app, _ = gated_app()
    async with client_for(app) as client:
        status = await client.get("/gate/status")
        assert status.status_code == 200 and status.json()["limit"] == 1
        metrics = await client.get("/gate/metrics")
        assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
        assert "adaptive_gate_limit 1.0" in metrics.text
        page = await client.get("/gate/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        data = await client.get("/gate/dashboard/data")
        assert set(data.json()) == {"now_unix_s", "status", "history", "oom_unix_s"}
        ready = await client.get("/gate/ready")
        assert ready.status_code == 200 and ready.json() == {"ready": True, "reasons": [], "degraded": []}
        head = await client.head("/gate/ready")
        assert head.status_code == 200 and head.content == b""
        # Without a token, there is no limits endpoint: the request reaches the app (404 there).
        assert (await client.put("/gate/limits", json={"pin": 2})).status_code == 404
        wrong_method = await client.post("/gate/status")
        assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "GET, HEAD"


async def test_the_dashboard_is_self_contained() -> None:
    app, _ = gated_app()
    async with client_for(app) as client:
        page = (await client.get("/gate/dashboard")).text
    # Air-gapped: nothing fetched from elsewhere, no script or style by URL.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<script src" not in page and "@import" not in page
    assert "/data" in page  # it reads its data from beside itself, wherever the page was moved


async def test_endpoints_move_and_switch_off() -> None:
    app, _ = gated_app(
        status_path="/ops/status", metrics_path=None, dashboard_path="/ops/dash", ready_path="/ops/ready"
    )
    async with client_for(app) as client:
        assert (await client.get("/ops/status")).status_code == 200
        assert (await client.get("/ops/dash/data")).status_code == 200
        assert (await client.get("/ops/ready")).status_code == 200
        for gone in ("/gate/status", "/gate/metrics", "/gate/dashboard", "/gate/ready"):
            assert (await client.get(gone)).status_code == 404, gone


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"metrics_path": "/gate/status"}, "metrics_path and status_path are both"),
        ({"ready_path": "ready"}, "ready_path must be a path starting with '/'"),
        ({"dashboard_path": "/gate/dash/"}, "no trailing '/'"),
        ({"admin_token": "short"}, "at least 16 characters"),
        ({"admin_token": " " + TOKEN}, "without surrounding spaces"),
        ({"admin_token": TOKEN, "unprotected": ("ready",)}, "unprotected may name status, metrics, dashboard"),
        ({"workers": 0}, "workers must be >= 1"),
    ],
)
def test_bad_endpoint_options_say_what_is_wrong(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        AdaptiveGate(FastAPI(), probe=None, **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"admin_token": TOKEN, "unprotected": "metrics"}, "unprotected must be a tuple"),
        ({"admin_token": 12345678901234567}, "admin_token must be a str"),
        ({"health_paths": "/healthz"}, "health_paths must be a tuple"),
    ],
)
def test_options_of_the_wrong_type_say_so(options: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        AdaptiveGate(FastAPI(), probe=None, **options)


async def test_a_token_protects_status_metrics_and_dashboard_but_never_readiness() -> None:
    app, _ = gated_app(admin_token=TOKEN)
    async with client_for(app) as client:
        for path in ("/gate/status", "/gate/metrics", "/gate/dashboard/data"):
            bare = await client.get(path)
            assert bare.status_code == 401 and bare.headers["www-authenticate"] == 'Bearer realm="adaptive-gate"'
            wrong = await client.get(path, headers={"Authorization": "Bearer " + "x" * len(TOKEN)})
            assert wrong.status_code == 401 and "invalid_token" in wrong.headers["www-authenticate"]
            basic = await client.get(path, headers={"Authorization": f"Basic {TOKEN}"})
            assert basic.status_code == 401
            assert (await client.get(path, headers=AUTH)).status_code == 200
        login = await client.get("/gate/dashboard")
        assert login.status_code == 401 and "sessionStorage" in login.text  # a page that asks for the token
        assert (await client.get("/gate/dashboard", headers=AUTH)).status_code == 200
        assert (await client.get("/gate/ready")).status_code == 200
        # Nothing secret in what the endpoints show.
        for path in ("/gate/status", "/gate/metrics", "/gate/dashboard", "/gate/dashboard/data", "/gate/limits"):
            assert TOKEN not in (await client.get(path, headers=AUTH)).text, path
        assert (await client.get("/gate/status", headers=AUTH)).json()["options"]["admin_token_set"] is True


async def test_unprotected_leaves_one_endpoint_open() -> None:
    app, _ = gated_app(admin_token=TOKEN, unprotected=("metrics",))
    async with client_for(app) as client:
        assert (await client.get("/gate/metrics")).status_code == 200
        assert (await client.get("/gate/status")).status_code == 401
        assert (await client.put("/gate/limits", json={"pin": 2})).status_code == 401  # never open


async def test_put_limits_pins_and_bounds_the_limit_at_run_time() -> None:
    app, held = gated_app(admin_token=TOKEN, max_limit=16, controller=Fixed(8), max_queue=64)
    async with client_for(app) as client:
        assert (await client.get("/gate/status")).status_code == 401
        pinned = await client.put("/gate/limits", json={"pin": 2}, headers=AUTH)
        assert pinned.status_code == 200
        assert pinned.json()["limit"] == 2 and pinned.json()["operator"] == {
            "min_limit": 2,
            "max_limit": 2,
            "pinned": True,
        }
        status = (await client.get("/gate/status", headers=AUTH)).json()
        assert (status["limit"], status["bound"], status["max_limit"]) == (2, "operator", 2)
        assert status["limit_changes"][-1]["reason"] == "operator"

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(client.post, "/work")
            await wait_until(lambda: held.entered == 2 and find_gate(app).statistics().queued == 4)
            assert held.running == 2  # the pin holds: two run, four wait
            widened = await client.put("/gate/limits", json={"min_limit": 1, "max_limit": 5}, headers=AUTH)
            assert widened.json()["limit"] == 5
            await wait_until(lambda: held.running == 5)
            held.go.set()

        back = await client.put("/gate/limits", json={"pin": None}, headers=AUTH)
        assert back.json()["operator"] is None and back.json()["limit"] == 8
        assert held.peak == 5
        # A pin at the controller's own limit is the operator's all the same; bounds that do not bind are not
        assert (await client.put("/gate/limits", json={"pin": 8}, headers=AUTH)).status_code == 200
        assert (await client.get("/gate/status", headers=AUTH)).json()["bound"] == "operator"
        assert (
            await client.put("/gate/limits", json={"min_limit": 1, "max_limit": 12}, headers=AUTH)
        ).status_code == 200
        assert (await client.get("/gate/status", headers=AUTH)).json()["bound"] == "controller"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b"{}",
        b'{"pin": 0}',
        b'{"pin": -3}',
        b'{"pin": 2.5}',
        b'{"pin": "4"}',
        b'{"pin": true}',
        b'{"pin": 99999}',
        b'{"pin": 2, "max_limit": 4}',
        b'{"min_limit": 6, "max_limit": 3}',
        b'{"limit": 3}',
        b'{"max_limit": 9}',  # above the configured 8: the controller never asks for more, so nothing would change
        b'{"min_limit": 2, "max_limit": 20}',
    ],
)
async def test_put_limits_refuses_nonsense_and_changes_nothing(body: bytes) -> None:
    app, _ = gated_app(admin_token=TOKEN, controller=Fixed(3), max_limit=8)
    async with client_for(app) as client:
        before = (await client.get("/gate/status", headers=AUTH)).json()
        answer = await client.put("/gate/limits", content=body, headers=AUTH)
        assert answer.status_code == 422 and answer.json()["detail"]
        after = (await client.get("/gate/status", headers=AUTH)).json()
        assert (after["limit"], after["operator"], after["limit_changes"]) == (3, None, before["limit_changes"])


async def test_put_limits_refuses_a_huge_body_and_other_methods() -> None:
    app, _ = gated_app(admin_token=TOKEN)
    async with client_for(app) as client:
        huge = await client.put("/gate/limits", content=b"{" + b" " * 20000 + b"}", headers=AUTH)
        assert huge.status_code == 413
        assert (await client.post("/gate/limits", json={"pin": 1}, headers=AUTH)).status_code == 405
        current = await client.get("/gate/limits", headers=AUTH)
        assert current.json()["configured"] == {"min_limit": 1, "max_limit": 64}


async def test_the_controller_does_not_creep_while_the_operator_holds_the_limit_down() -> None:
    app, held = gated_app(admin_token=TOKEN, controller=AIMD(), max_queue=64)
    gate_limit_seen = []
    async with client_for(app) as client:
        await client.put("/gate/limits", json={"max_limit": 2}, headers=AUTH)
        held.go.set()
        for _ in range(20):
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(client.post, "/work")
            gate_limit_seen.append(find_gate(app).statistics().limit)
        gate = find_gate(app)
        assert max(gate_limit_seen) == 2
        assert gate.statistics().controller.limit <= 2  # demand held by the operator is not demand to grow on


class BrokenProbe:
    def sample(self) -> MemorySample:
        raise RuntimeError("NVML: GPU is lost")


async def test_ready_says_no_while_the_queue_is_full_and_degraded_while_the_probe_is_broken() -> None:
    app, held = gated_app(controller=Fixed(1), max_queue=1)
    async with client_for(app) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.post, "/work")
            tg.start_soon(client.post, "/work")
            await wait_until(lambda: find_gate(app).statistics().queued == 1)
            full = await client.get("/gate/ready")
            assert full.status_code == 503 and "queue is full" in full.json()["reasons"][0]
            held.go.set()
        assert (await client.get("/gate/ready")).status_code == 200

    app, _ = gated_app(probe=BrokenProbe(), sample_period=0.01)
    async with LifespanManager(app), client_for(app) as client:
        await client.get("/healthz")
        await wait_until(lambda: find_gate(app).statistics().probe.consecutive_errors >= 3)
        broken = await client.get("/gate/ready")
        # An NVML outage hits every replica at once: taking them all out of rotation would be an outage.
        assert broken.status_code == 200 and broken.json()["reasons"] == []
        assert "probe failed" in broken.json()["degraded"][0]
        assert "probe failed" in (await client.get("/gate/status")).json()["ready"]["degraded"][0]


async def test_health_paths_are_never_gated_even_when_every_request_is() -> None:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, tag=None, probe=None, controller=Fixed(1), max_queue=0)
    held = Held()
    app.add_api_route("/work", held, methods=["POST"])

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    async with client_for(app) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.post, "/work")
            await wait_until(lambda: held.running == 1)
            assert (await client.post("/work")).status_code == 503  # gated, and full
            assert (await client.get("/healthz")).status_code == 200  # not gated
            assert (await client.get("/gate/ready")).status_code in (200, 503)  # answered by the gate itself
            held.go.set()


async def test_one_structured_log_line_per_limit_change_and_none_per_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, held = gated_app(controller=AIMD(), max_queue=64)
    held.go.set()
    caplog.set_level(logging.INFO, logger="adaptive_gate")
    async with client_for(app) as client:
        for _ in range(10):
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(client.post, "/work")
    stats = find_gate(app).statistics()
    changes = [r for r in caplog.records if getattr(r, "adaptive_gate", {}).get("event") == "limit_change"]
    assert (
        len(changes)
        == len(stats.limit_changes)
        == stats.counters["limit_increases"] + stats.counters["limit_decreases"]
    )
    assert len(changes) >= 2
    first = changes[0].adaptive_gate  # type: ignore[attr-defined]
    assert (first["old"], first["new"]) == (stats.limit_changes[0].old, stats.limit_changes[0].new)
    assert re.fullmatch(r"adaptive_gate limit change: old=\d+ new=\d+ reason=\".+\"", changes[0].getMessage())
    # 80 requests, and nothing else at INFO or above.
    assert len([r for r in caplog.records if r.levelno >= logging.INFO]) == len(changes)


async def test_ooms_log_once_per_congestion_event(caplog: pytest.LogCaptureFixture) -> None:
    from adaptive_gate.testing import SimulatedGPU

    gpu = SimulatedGPU(10, seed=1)
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None, controller=Fixed(8), max_queue=64)
    gate_open = anyio.Event()

    @app.post("/work", tags=["gpu"])
    async def work() -> dict[str, bool]:
        await gate_open.wait()
        with gpu.allocate(4):
            await anyio.sleep(0.01)
        return {"ok": True}

    caplog.set_level(logging.INFO, logger="adaptive_gate")
    async with client_for(app) as client:
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await client.post("/work")).status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(one)
            await wait_until(lambda: find_gate(app).statistics().in_flight == 8)
            gate_open.set()
    assert statuses.count(503) >= 5
    oom_lines = [r for r in caplog.records if "out of memory" in r.getMessage() and r.levelno >= logging.INFO]
    assert len(oom_lines) == 1  # Fixed never cuts: one congestion event, one line


def test_status_json_is_plain_json() -> None:
    gate = AdaptiveGate(FastAPI(), probe=None, admin_token=TOKEN)
    document = json.loads(json.dumps(gate.status()))
    assert document["workers"]["count"] >= 1 and document["ready"] == {"ready": True, "reasons": [], "degraded": []}
    assert TOKEN not in json.dumps(document)


async def test_metrics_404_with_advice_where_prometheus_client_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptive_gate._observe import metrics

    monkeypatch.setattr(metrics, "available", lambda: False)
    app, _ = gated_app()
    async with client_for(app) as client:
        answer = await client.get("/gate/metrics")
    assert answer.status_code == 404 and "pip install 'adaptive-gate[metrics]'" in answer.json()["detail"]
