"""Hostile clients, lying probes and bad configuration: each attack of issue 15, reproduced through
the public surface (a real uvicorn where the transport matters), and what the gate does instead."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptive_gate import AdaptiveGate, Fixed, MemorySample
from adaptive_gate.memory import MAX_BYTES

from .asgi_helpers import RawClient, call, http_scope
from .helpers import client_for, find_gate, gated_app, wait_until
from .servers import free_port, serve, wait_for, wait_until_healthy

TOKEN = "t" * 32


def echo_app(**options: Any) -> FastAPI:
    """A gated route that reads its body: what every upload route does."""
    app = FastAPI()
    options.setdefault("probe", None)
    app.add_middleware(AdaptiveGate, **options)

    @app.post("/infer", tags=["gpu"])
    async def infer(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


# -- 1. readings that lie ------------------------------------------------------------------------


class ScriptedProbe:
    """Returns (or raises) what the test scripted, one item per call; then valid readings."""

    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = list(outputs)
        self.calls = 0

    def sample(self) -> Any:
        self.calls += 1
        if not self.outputs:
            return MemorySample(1 << 30, 8 << 30)
        output = self.outputs.pop(0)
        if isinstance(output, BaseException):
            raise output
        if callable(output):
            return output()
        return output


def forged(**fields: Any) -> MemorySample:
    """A MemorySample whose fields were replaced after its checks ran: what a lying probe can hand over."""
    sample = MemorySample(1, 2)
    for name, value in fields.items():
        object.__setattr__(sample, name, value)
    return sample


@pytest.mark.parametrize(
    ("output", "error"),
    [
        (lambda: MemorySample(float("nan"), 8 << 30), "used_bytes must be a whole number"),
        (lambda: MemorySample(1 << 30, float("inf")), "total_bytes must be a whole number"),
        (lambda: MemorySample(9 << 30, 8 << 30), "must not exceed total_bytes"),
        (lambda: MemorySample(1 << 30, 8 << 30, oom_count=1.5), "oom_count must be a whole number"),  # type: ignore[arg-type]
        (lambda: MemorySample(1 << 30, 8 << 30, oom_count="3"), "oom_count must be an int"),  # type: ignore[arg-type]
        (forged(used_bytes=float("nan")), "used_bytes must be a whole number"),
        (forged(total_bytes=10**400), "total_bytes must be in"),
        (forged(oom_count=-1), "oom_count must be in"),
        ({"used_bytes": 1}, "not a MemorySample"),
        (KeyboardInterrupt(), "the probe raised KeyboardInterrupt"),
    ],
)
@pytest.mark.anyio
async def test_a_lying_reading_is_a_probe_error_and_the_gate_lives_on(
    output: Any, error: str, caplog: pytest.LogCaptureFixture
) -> None:
    shutdown_ran = anyio.Event()
    probe = ScriptedProbe([output, output, output])

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        shutdown_ran.set()

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(AdaptiveGate, probe=probe, sample_period=0.01)

    @app.post("/infer", tags=["gpu"])
    def infer() -> dict[str, bool]:
        return {"ok": True}

    async with LifespanManager(app), client_for(app) as client:
        await wait_until(lambda: probe.calls >= 5)  # the bad ones, then good ones: the loop lived on
        assert not shutdown_ran.is_set()  # the app's own lifespan was not torn down
        assert (await client.post("/infer")).status_code == 200
        status = await client.get("/gate/status")
        assert status.status_code == 200
        document = json.loads(status.content, parse_constant=_no_constants)
        gate = find_gate(app)
        assert gate.statistics().probe.errors == 3
        assert document["probe"]["errors"] == 3 and document["memory"]["used_bytes"] == 1 << 30
        assert (await client.get("/gate/metrics")).status_code == 200
        assert (await client.get("/gate/dashboard/data")).status_code == 200
    assert shutdown_ran.is_set()
    assert error in caplog.text  # said, with what was wrong, in the warning the gate logs


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


@pytest.mark.anyio
async def test_the_error_says_what_was_wrong_with_the_reading() -> None:
    probe = ScriptedProbe([lambda: MemorySample(9 << 30, 8 << 30)] * 50)
    app = echo_app(probe=probe, sample_period=0.01)
    async with LifespanManager(app), client_for(app) as client:
        await wait_until(lambda: probe.calls >= 2)
        status = (await client.get("/gate/status")).json()
    assert status["probe"]["healthy"] is False
    assert "used_bytes (9663676416) must not exceed total_bytes (8589934592)" in status["probe"]["last_error"]
    assert status["memory"] is None  # no reading was believed


# -- 2. a slow uploader, a client that reads nothing ------------------------------------------------


@pytest.mark.anyio
async def test_a_body_is_read_no_longer_than_the_request_s_own_deadline() -> None:
    """With `queue_timeout` 200 ms, a body that comes over 0.6 s is answered 408 when the deadline passes: the
    answer after it is one nobody waits for (it was given a second, and served). Envoy's deadline header is
    another matter: Envoy starts its timer once it has the whole request, so the same body under a header of
    200 ms is read whole and served (the header's deadline runs from the end of the body)."""

    def slow_body() -> Callable[[], Awaitable[dict[str, Any]]]:
        parts = iter([b"a", b"b", b"c"])

        async def receive() -> dict[str, Any]:
            part = next(parts, None)
            if part is None:
                await anyio.sleep(3600)
            if sent[0]:
                await anyio.sleep(0.3)
            sent[0] += 1
            return {"type": "http.request", "body": part, "more_body": sent[0] < 3}

        return receive

    sent = [0]
    app = echo_app(controller=Fixed(1), queue_timeout=0.2)
    client = RawClient()
    await app(
        http_scope("/infer", method="POST", headers=[(b"transfer-encoding", b"chunked")]), slow_body(), client.send
    )
    assert client.status == 408 and b'"reason":"body_timeout"' in client.body
    assert sent[0] == 1  # answered at its deadline, with the second part still 0.1 s away
    sent = [0]
    proxied = echo_app(controller=Fixed(1))
    head = [(b"transfer-encoding", b"chunked"), (b"x-envoy-expected-rq-timeout-ms", b"200")]
    client = RawClient()
    await proxied(http_scope("/infer", method="POST", headers=head), slow_body(), client.send)
    assert client.status == 200 and sent[0] == 3
    assert find_gate(app).statistics().counters["admitted"] == 0


@pytest.mark.anyio
async def test_a_body_held_back_whole_past_the_deadline_is_not_served() -> None:
    """The whole body in one message, sent 0.3 s after a 200 ms deadline (no timer runs for a first message):
    read, then answered 408, before the route is asked (it had been served after its client left)."""
    app = echo_app(controller=Fixed(1), queue_timeout=0.2)
    head = [(b"content-length", b"3")]
    sent = [False]

    async def receive() -> dict[str, Any]:
        if sent[0]:
            await anyio.sleep(3600)
        await anyio.sleep(0.3)
        sent[0] = True
        return {"type": "http.request", "body": b"abc", "more_body": False}

    client = RawClient()
    await app(http_scope("/infer", method="POST", headers=head), receive, client.send)
    assert client.status == 408 and b'"reason":"body_timeout"' in client.body
    counters = find_gate(app).statistics().counters
    assert counters["admitted"] == 0 and counters["body_timeouts"] == 1


def test_a_slow_uploader_holds_no_gpu_slot() -> None:
    """One connection sending a byte at a time used to hold the only slot; now its body is read
    before it may take one, and it is answered 408 when the body timeout passes."""
    app = echo_app(controller=Fixed(1), body_timeout=2.0, queue_timeout=10)
    with serve(app) as url:
        port = int(url.rsplit(":", 1)[1])
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"POST /infer HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
        stop = threading.Event()

        def trickle() -> None:
            for _ in range(40):
                if stop.wait(0.05):
                    return
                try:
                    slow.sendall(b"a")
                except OSError:
                    return

        trickler = threading.Thread(target=trickle)
        trickler.start()
        try:
            for _ in range(3):
                response = httpx.post(f"{url}/infer", content=b"x" * 10, timeout=10)
                assert response.status_code == 200 and response.json() == {"bytes": 10}
            # Served while the slow one still uploads: its body timeout has not struck yet (an order of
            # events; holding the slot, it would have kept these three waiting until it did).
            gate = find_gate(app)
            stats = gate.statistics()
            assert stats.counters["admitted"] == 3 and stats.counters["body_timeouts"] == 0
            slow.settimeout(30)
            answer = slow.recv(65536)
        finally:
            stop.set()
            trickler.join()
            slow.close()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"reason":"body_timeout"' in answer
    stats = gate.statistics()
    assert stats.counters["body_timeouts"] == 1 and stats.in_flight == 0


def test_a_client_that_reads_nothing_loses_its_slot_after_the_send_timeout() -> None:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None, controller=Fixed(1), send_timeout=1.0)

    @app.get("/stream", tags=["gpu"])
    async def stream(chunks: int = 4096) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(chunks):  # 256 MiB at most: far more than any socket buffer holds
                yield b"z" * 65536

        return StreamingResponse(body())

    with serve(app) as url:
        port = int(url.rsplit(":", 1)[1])
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", port))
        reader.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")  # and never reads
        gate = find_gate_when_built(app)
        wait_for(lambda: gate.statistics().in_flight == 1)
        # The 256 MiB stream never ends while its reader reads nothing: only the send timeout can free
        # the slot (the client's timeout is a guard against a hang, not a measure).
        response = httpx.get(f"{url}/stream", params={"chunks": 2}, timeout=30)
        reader.close()
        wait_for(lambda: gate.statistics().in_flight == 0)
    assert response.status_code == 200 and len(response.content) == 2 * 65536
    stats = gate.statistics()
    assert stats.counters["failed"] == 1 and stats.counters["completed"] == 1  # the stuck one was cut short


def find_gate_when_built(app: Any) -> AdaptiveGate:
    holder: list[AdaptiveGate] = []

    def built() -> bool:
        try:
            holder.append(find_gate(app))
        except LookupError:
            return False
        return True

    wait_for(built)
    return holder[0]


@pytest.mark.anyio
async def test_a_body_over_max_body_bytes_is_413_before_it_is_read() -> None:
    app = echo_app(max_body_bytes=1000)
    async with client_for(app) as client:
        announced = await client.post("/infer", content=b"x" * 1001)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"y" * 600  # no content-length: found out while reading

        streamed = await client.post("/infer", content=chunks())
        fits = await client.post("/infer", content=b"x" * 1000)
    assert announced.status_code == 413 and announced.json()["reason"] == "body_too_large"
    assert "max_body_bytes (1000 bytes)" in announced.json()["detail"]
    assert streamed.status_code == 413
    assert fits.status_code == 200
    gate = find_gate(app)
    stats = gate.statistics()
    assert stats.counters["bodies_too_large"] == 2 and stats.counters["admitted"] == 1


# -- 3. an over-long deadline header --------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("digits", [20, 400, 4300, 5000])
async def test_an_over_long_deadline_header_is_no_500(digits: int) -> None:
    app, held = gated_app(controller=Fixed(1))
    async with client_for(app) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.post, "/work")
            await wait_until(lambda: held.running == 1)
            queued: list[httpx.Response] = []

            async def must_queue() -> None:
                queued.append(await client.post("/work", headers={"x-envoy-expected-rq-timeout-ms": "9" * digits}))

            tg.start_soon(must_queue)
            await wait_until(lambda: find_gate(app).statistics().queued == 1)
            held.go.set()
    assert queued[0].status_code == 200  # taken as "longer than queue_timeout", and served


# -- 4. deeply nested JSON at the operator endpoint -----------------------------------------------


@pytest.mark.anyio
async def test_deeply_nested_limits_json_is_422() -> None:
    app, _ = gated_app(admin_token=TOKEN)
    body = "[" * 8000 + "]" * 8000
    async with client_for(app) as client:
        response = await client.put("/gate/limits", content=body, headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 422 and "nested too deep" in response.json()["detail"]


# -- 7. a probe that hangs -------------------------------------------------------------------------


class HangingProbe:
    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def sample(self) -> MemorySample:
        self.calls += 1
        self.release.wait(30)
        return MemorySample(1, 2)


@pytest.mark.anyio
async def test_a_hung_probe_pins_one_thread_and_is_not_called_again_until_it_returns() -> None:
    probe = HangingProbe()
    app = echo_app(probe=probe, sample_period=0.01, probe_timeout=0.02)
    threads_before = threading.active_count()
    try:
        async with LifespanManager(app), client_for(app) as client:
            gate = find_gate(app)
            await wait_until(lambda: gate.statistics().probe.errors >= 5)
            assert probe.calls == 1  # one call hangs; the retries wait for it instead of adding threads
            assert threading.active_count() <= threads_before + 1
            assert (await client.post("/infer", content=b"abc")).status_code == 200
            status = (await client.get("/gate/status")).json()
            assert "has not returned after" in status["probe"]["last_error"]
            probe.release.set()  # the driver answers again: readings resume
            await wait_until(lambda: gate.statistics().probe.last_sample is not None)
            assert probe.calls >= 2
    finally:
        probe.release.set()


@pytest.mark.anyio
async def test_a_probe_that_hangs_at_start_up_shows_in_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    release, returned = threading.Event(), threading.Event()

    def hanging_auto_probe() -> tuple[None, str]:
        release.wait(30)
        returned.set()
        return None, "probe: none"

    monkeypatch.setattr("adaptive_gate._http.operations.auto_probe", hanging_auto_probe)
    app = echo_app(probe="auto", probe_timeout=0.02, sample_period=0.01)
    try:
        async with LifespanManager(app), client_for(app) as client:
            assert not returned.is_set()  # start-up did not wait out the hung probe
            await wait_until(lambda: find_gate(app).statistics().probe.errors >= 2)
            status = (await client.get("/gate/status")).json()
            assert status["probe"]["healthy"] is False
            assert "the probe did not start" in status["probe"]["last_error"]
            assert (await client.post("/infer", content=b"x")).status_code == 200
    finally:
        release.set()


def test_sigint_ends_a_server_whose_probe_hangs(tmp_path: Any) -> None:
    """A hung probe call used to sit on a non-daemon worker thread: after Ctrl-C, uvicorn said
    'Finished server process' and the process never exited."""
    module = tmp_path / "hung_probe_app.py"
    module.write_text(
        "import threading\n"
        "from fastapi import FastAPI\n"
        "from adaptive_gate import AdaptiveGate\n"
        "class Hung:\n"
        "    def sample(self):\n"
        "        threading.Event().wait()\n"
        "app = FastAPI()\n"
        "app.add_middleware(AdaptiveGate, probe=Hung(), probe_timeout=0.05, sample_period=0.05)\n"
        "@app.get('/healthz')\n"
        "def healthz():\n"
        "    return {'ok': True}\n"
    )
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.getcwd()}"}
    command = [sys.executable, "-m", "uvicorn", "hung_probe_app:app", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, "the server", timeout_s=60)
        time.sleep(0.3)  # the probe's first call is under way, and hangs
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) is not None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- 8. what the queue holds in bytes --------------------------------------------------------------


def length(nbytes: int) -> list[tuple[bytes, bytes]]:
    return [(b"host", b"test"), (b"content-length", str(nbytes).encode())]


@pytest.mark.anyio
async def test_the_bytes_of_queued_bodies_are_capped() -> None:
    app = FastAPI()
    app.add_middleware(AdaptiveGate, probe=None, controller=Fixed(1), max_body_bytes=600, max_buffered_bytes=1000)
    go = anyio.Event()

    @app.post("/infer", tags=["gpu"])
    async def infer(request: Request) -> dict[str, int]:
        body = await request.body()
        await go.wait()
        return {"bytes": len(body)}

    first, second, third = RawClient([b"a"]), RawClient([b"b" * 500]), RawClient([b"c" * 550])
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, app, first, "/infer")
        await wait_until(lambda: find_gate(app).statistics().in_flight == 1)
        gate = find_gate(app)
        tg.start_soon(lambda: call(app, second, "/infer", headers=length(500)))
        await wait_until(lambda: gate.statistics().queued == 1)
        await call(app, third, "/infer", headers=length(550))  # 500 + 550 bytes would pass the 1000 the queue may hold
        assert third.status == 503 and json.loads(third.body)["reason"] == "queue_full"
        assert "fill the gate's buffer" in json.loads(third.body)["detail"]
        go.set()
    assert first.status == 200 and second.status == 200
    assert json.loads(second.body) == {"bytes": 500}
    assert gate._body_budget.held_bytes == 0  # every byte given back


@pytest.mark.anyio
async def test_a_client_that_leaves_after_a_large_body_is_noticed() -> None:
    """Past 1 MiB the gate used to stop reading, so a disconnect went unnoticed and the dead request
    later ran; the whole body is read now, and the disconnect after it is seen."""
    app, held = gated_app(controller=Fixed(1))
    first = RawClient()
    big = RawClient([b"x" * 65536] * 40)  # 2.5 MiB
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, app, first, "/work")
        await wait_until(lambda: held.running == 1)
        gate = find_gate(app)
        tg.start_soon(lambda: call(app, big, "/work", headers=length(40 * 65536)))
        await wait_until(lambda: gate.statistics().queued == 1 and not big.chunks)
        big.disconnect.set()
        await wait_until(lambda: gate.statistics().queued == 0)
        held.go.set()
    assert gate.statistics().counters["left_queue"] == 1 and held.entered == 1 and big.sent == []
    assert gate._body_budget.held_bytes == 0


# -- 9. configuration that used to turn the gate off silently --------------------------------------


@pytest.mark.anyio
async def test_a_list_of_tags_gates_as_meant() -> None:
    app, held = gated_app(tag=["gpu", "vision"], controller=Fixed(1))
    held.go.set()
    async with client_for(app) as client:
        assert (await client.post("/work")).status_code == 200
    gate = find_gate(app)
    assert gate.statistics().counters["admitted"] == 1
    assert gate.status()["options"]["tag"] == ["gpu", "vision"]


@pytest.mark.anyio
async def test_a_gate_wrapped_around_the_app_finds_its_routes() -> None:
    inner = FastAPI()

    @inner.post("/infer", tags=["gpu"])
    def infer() -> dict[str, bool]:
        return {"ok": True}

    @inner.get("/free")
    def free() -> dict[str, bool]:
        return {"ok": True}

    gate = AdaptiveGate(inner, probe=None)
    async with client_for(gate) as client:
        assert (await client.post("/infer")).status_code == 200
        assert (await client.get("/free")).status_code == 200
    assert gate.statistics().counters["admitted"] == 1  # the tagged route only


# -- 10. truthfulness ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_pathsend_ends_the_request_as_a_success() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.pathsend", "path": "/etc/hostname"})

    gate = AdaptiveGate(app, tag=None, probe=None)
    client = RawClient()
    scope = http_scope("/file", "GET")
    scope["extensions"] = {"http.response.pathsend": {}}
    await gate(scope, client.receive, client.send)
    assert client.status == 200
    stats = gate.statistics()
    assert stats.counters["completed"] == 1 and stats.counters["failed"] == 0 and stats.in_flight == 0
    assert stats.service_histogram.buckets[-1][1] == 1  # one service time observed


# -- properties: whatever a probe hands over ---------------------------------------------------------

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)
FIELDS = ("used_bytes", "total_bytes", "oom_count", "allocated_bytes", "reserved_bytes", "process_count")


@given(st.fixed_dictionaries({name: anything for name in FIELDS}))
def test_a_memory_sample_is_either_refused_or_plausible(fields: dict[str, Any]) -> None:
    try:
        sample = MemorySample(**fields)
    except (TypeError, ValueError):
        return
    assert all(isinstance(getattr(sample, name), int) for name in FIELDS[:2])
    assert 0 <= sample.used_bytes <= sample.total_bytes <= MAX_BYTES and sample.total_bytes > 0
    assert 0.0 <= sample.utilisation <= 1.0
    for name in FIELDS[2:]:
        value = getattr(sample, name)
        assert value is None or (type(value) is int and 0 <= value <= MAX_BYTES)


class _Hang:
    """A probe output: the call blocks longer than the probe's timeout, then answers."""


probe_outputs = st.lists(
    st.one_of(
        st.builds(
            lambda total, used: MemorySample(round(total * used), total),
            st.integers(1, 2**45),
            st.floats(0, 1),
        ),
        st.builds(lambda fields: forged(**fields), st.dictionaries(st.sampled_from(FIELDS), anything, max_size=3)),
        anything,
        st.sampled_from(
            [ValueError("NVML"), RuntimeError("driver"), SystemExit(3), KeyboardInterrupt(), MemoryError()]
        ),
        st.just(_Hang()),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(probe_outputs)
def test_whatever_the_probe_does_the_gate_admits_and_its_status_is_json(outputs: list[Any]) -> None:
    anyio.run(_drive_gate_with, outputs)


async def _drive_gate_with(outputs: list[Any]) -> None:
    released = threading.Event()

    class Probe:
        calls = 0

        def sample(self) -> Any:
            Probe.calls += 1
            if not outputs:
                return MemorySample(1 << 30, 8 << 30)
            output = outputs.pop(0)
            if isinstance(output, _Hang):
                released.wait(0.05)
                return MemorySample(1 << 30, 8 << 30)
            if isinstance(output, BaseException):
                raise output
            return output

    expected_calls = len(outputs) + 1
    app = echo_app(probe=Probe(), sample_period=0.001, probe_timeout=0.01)
    async with LifespanManager(app), client_for(app) as client:
        await wait_until(lambda: Probe.calls >= expected_calls)
        for _ in range(2):
            assert (await client.post("/infer", content=b"x")).status_code == 200
        for path in ("/gate/status", "/gate/dashboard/data", "/gate/ready"):
            response = await client.get(path)
            assert response.status_code == 200
            json.loads(response.content, parse_constant=_no_constants)
        status = (await client.get("/gate/status")).json()
    assert 1 <= status["limit"] <= 64 and status["in_flight"] == 0
    memory = status["memory"]
    assert memory is None or 0 <= memory["used_bytes"] <= memory["total_bytes"]


@pytest.mark.anyio
@pytest.mark.parametrize("offset_s", [-1e6, 1e6])
async def test_the_send_watchdog_runs_on_the_gates_own_clock(offset_s: float) -> None:
    """Found in review: the watchdog stamped a send with `time.monotonic()` and judged it on the gate's
    `clock`. With a clock behind it a stuck client kept its slot for ever; ahead of it, a client
    reading slowly but well was cut off at the first tick. Both readings come from one clock now."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(3):
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    gate = AdaptiveGate(app, tag=None, probe=None, controller=Fixed(1), send_timeout=0.5,
                        clock=lambda: time.monotonic() + offset_s)  # fmt: skip
    stuck, slow_but_reading = anyio.Event(), anyio.Event()
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": [], "query_string": b"", "root_path": "",
             "http_version": "1.1"}  # fmt: skip

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        return {}

    async def stuck_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            stuck.set()
            await anyio.sleep_forever()  # a client that reads nothing

    async def slow_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            await anyio.sleep(0.1)  # reads, slowly: well within the send timeout
        if not message.get("more_body", True):
            slow_but_reading.set()

    async with gate.running():
        with anyio.fail_after(30):  # a guard against a hang, not a measure
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(gate, scope, receive, stuck_send)
                await stuck.wait()
                await wait_until(lambda: gate.statistics().in_flight == 0)  # the watchdog gave the slot back
                task_group.cancel_scope.cancel()  # the server would close the connection
            await gate(scope, receive, slow_send)
            assert slow_but_reading.is_set()
    counters = gate.statistics().counters
    assert counters["failed"] == 1 and counters["completed"] == 1
