"""The demo service: every route and every bad input in process, and the real thing as a subprocess."""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
import torch
from asgi_lifespan import LifespanManager

from demo_service import Settings, create_app
from demo_service.__main__ import parse_args, parse_size, settings_from
from demo_service.model import DEFAULT_MODEL, build_model, leaf_modules, weight_bytes
from demo_service.policies import parse_policy

from .helpers import find_gate, image_bytes, wait_until
from .servers import free_port, wait_until_healthy

pytestmark = pytest.mark.anyio

MiB = 2**20
# A public-domain portrait (U.S. Navy photograph; see tests/data/README.md) and what the pretrained
# default model must see in it.
PHOTO = Path(__file__).parent / "data" / "grace_hopper.jpg"
PHOTO_LABEL = "military uniform"


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int, height: int, *, before_pixels: bytes = b"") -> bytes:
    """A tiny PNG whose header claims `width` x `height`, with `before_pixels` chunks ahead of its data."""
    header = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    pixels = png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
    return b"\x89PNG\r\n\x1a\n" + header + before_pixels + pixels + png_chunk(b"IEND", b"")


def jpeg_claiming(width: int, height: int) -> bytes:
    """A real small JPEG whose frame header (SOF0) is rewritten to claim `width` x `height`."""
    data = bytearray(image_bytes("JPEG"))
    frame = data.index(b"\xff\xc0") + 5  # marker, length (2 bytes), precision (1 byte), then height, width
    data[frame : frame + 4] = struct.pack(">HH", height, width)
    return bytes(data)


def inflating_chunk(kind: bytes, inflated_bytes: int) -> bytes:
    """A zTXt or iCCP chunk: a name, a compression method, and zlib data that inflates to `inflated_bytes`."""
    return png_chunk(kind, b"name\x00\x00" + zlib.compress(b"\x00" * inflated_bytes, 9))


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(architecture="resnet-tiny", max_pixels=1000 * 1000, max_files=4, max_file_bytes=MiB)
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://demo", timeout=60) as http:
            http.app = app  # type: ignore[attr-defined]
            yield http


async def test_predict_png_and_jpeg(client: httpx.AsyncClient) -> None:
    for fmt in ("PNG", "JPEG"):
        response = await client.post("/predict", files={"file": (f"x.{fmt.lower()}", image_bytes(fmt))})
        assert response.status_code == 200
        body = response.json()
        assert len(body["top5"]) == 5 and {"label", "score"} == set(body["top5"][0])
        assert body["device"].startswith("cpu (simulated GPU") and body["inference_ms"] > 0
        scores = [p["score"] for p in body["top5"]]
        assert scores == sorted(scores, reverse=True)


async def test_predict_batch(client: httpx.AsyncClient) -> None:
    files = [("files", (f"{i}.png", image_bytes(size=(30 + i, 30)))) for i in range(3)]
    response = await client.post("/predict/batch", files=files)
    assert response.status_code == 200 and len(response.json()["results"]) == 3


async def test_a_batch_weighs_its_declared_files_and_may_not_send_more(client: httpx.AsyncClient) -> None:
    files = [("files", (f"{i}.png", image_bytes(size=(30 + i, 30)))) for i in range(3)]
    weights: list[float] = []
    gate = find_gate(client.app)  # type: ignore[attr-defined]  # (the lifespan built the stack)
    admitted, enter = gate.core.admitted, gate.core.enter

    def watching(
        now_s: float, waited_s: float, units: float = 1, route: object = None, requests: float | None = None
    ) -> object:
        weights.append(units)
        return admitted(now_s, waited_s, units, route, requests)

    def watching_enter(
        timeout_s: float, units: float, route: object, arrived_s: float, now_s: float, requests: float | None = None
    ) -> object:
        # the fast way in: arrive and admitted in one
        ticket = enter(timeout_s, units, route, arrived_s, now_s, requests)
        if ticket is not None:
            weights.append(ticket.units)
        return ticket

    gate.core.admitted = watching  # type: ignore[method-assign]
    gate.core.enter = watching_enter  # type: ignore[method-assign]
    assert (await client.post("/predict/batch?files=3", files=files)).status_code == 200
    response = await client.post("/predict/batch?files=2", files=files)
    assert response.status_code == 400 and "?files=2 declared, 3 files sent" in response.text
    assert (await client.post("/predict/batch", files=files)).status_code == 200
    assert weights == [3.0, 2.0, 1.0]
    assert gate.statistics().in_flight == 0


@pytest.mark.parametrize(
    ("files", "status", "words"),
    [
        ({"file": ("a.txt", b"hello, not an image")}, 400, "not an image"),
        ({"file": ("a.gif", image_bytes("GIF"))}, 415, "GIF"),
        ({"file": ("a.png", image_bytes()[:60])}, 400, "truncated"),
        ({"file": ("big.png", image_bytes(size=(2000, 1000), mode="1"))}, 413, "pixels"),
        ({"file": ("empty.png", b"")}, 400, "empty"),
        ({"file": ("huge.png", b"\x89PNG" + b"0" * (2 * MiB))}, 413, "larger than"),
        ({}, 422, "file"),
    ],
)
async def test_bad_input_is_a_clear_4xx_and_frees_the_slot(
    client: httpx.AsyncClient, files: dict[str, tuple[str, bytes]], status: int, words: str
) -> None:
    response = await client.post("/predict", files=files or None, data={} if files else {"x": "y"})
    assert response.status_code == status
    assert words in str(response.json()["detail"])
    gate = find_gate(client.app)  # type: ignore[attr-defined]
    assert gate.statistics().in_flight == 0


@pytest.mark.parametrize(
    ("name", "data", "status", "words"),
    [
        ("png-30000x30000", png_bomb(30000, 30000), 413, "pixels"),
        ("png-10000x10000", png_bomb(10000, 10000), 413, "pixels"),  # between Pillow's warning and its error
        ("jpeg-60000x60000", jpeg_claiming(60000, 60000), 413, "pixels"),
        ("png-ztxt-2mib", png_bomb(32, 32, before_pixels=inflating_chunk(b"zTXt", 2 * MiB)), 400, "too large"),
        ("png-iccp-2mib", png_bomb(32, 32, before_pixels=inflating_chunk(b"iCCP", 2 * MiB)), 400, "too large"),
    ],
)
async def test_decompression_bombs_are_refused_before_decoding(
    client: httpx.AsyncClient, name: str, data: bytes, status: int, words: str
) -> None:
    """Files of a few kB that claim gigapixels or inflate their metadata past 1 MiB: a 4xx, never a 500."""
    assert len(data) < 16 * 1024
    response = await client.post("/predict", files={"file": (f"{name}.bin", data)})
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]
    assert find_gate(client.app).statistics().in_flight == 0  # type: ignore[attr-defined]


async def test_neighbour_control_on_the_simulated_card(client: httpx.AsyncClient) -> None:
    response = await client.put("/simulated-gpu/neighbour", params={"nbytes": 100 * MiB})
    assert response.status_code == 200 and response.json()["neighbour_bytes"] == 100 * MiB
    assert response.json()["held_bytes"] == 100 * MiB  # the card had that much free
    assert (await client.put("/simulated-gpu/neighbour", params={"nbytes": -1})).status_code == 422
    assert (await client.put("/simulated-gpu/neighbour", params={"nbytes": 0})).json()["neighbour_bytes"] == 0


async def test_too_many_files(client: httpx.AsyncClient) -> None:
    files = [("files", (f"{i}.png", image_bytes())) for i in range(5)]
    response = await client.post("/predict/batch", files=files)
    assert response.status_code == 413 and "at most 4" in response.json()["detail"]


async def test_health_is_not_gated_and_status_says_simulated(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"ok": True, "model_loaded": True}
    await client.post("/predict", files={"file": ("x.png", image_bytes())})
    gate = find_gate(client.app)  # type: ignore[attr-defined]
    await wait_until(lambda: gate.statistics().probe.last_sample is not None)  # the sampler's own period
    status = (await client.get("/gate/status")).json()
    assert status["memory"]["simulated"] is True and status["memory"]["total_bytes"] == 768 * MiB
    assert status["counters"]["admitted"] == 1 and status["counters"]["completed"] == 1


@pytest.mark.parametrize("architecture", ["resnet-tiny", DEFAULT_MODEL])
async def test_memory_per_request_follows_the_input(architecture: str) -> None:
    app = create_app(Settings(architecture=architecture))
    async with LifespanManager(app):
        classifier = app.state.classifier
        one, four = classifier.bytes_for((1, 3, 224, 224)), classifier.bytes_for((4, 3, 224, 224))
        assert 3.5 * one < four < 4.5 * one
        assert classifier.gpu.used_bytes == weight_bytes(classifier.model)  # the model's own weights sit on the card


async def test_the_simulated_card_runs_out_part_way_through_the_forward_pass() -> None:
    """Activations are charged as the layers produce them, as CUDA allocates them: a request that
    does not fit fails after the work of the layers before (not before any work), and frees all."""
    app = create_app(Settings(architecture="resnet-tiny"))
    async with LifespanManager(app):
        classifier = app.state.classifier
        gpu, shape = classifier.gpu, (1, 3, 224, 224)
        weights, per_image = gpu.used_bytes, classifier.bytes_for(shape)
        leaves = leaf_modules(classifier.model)
        ran: list[torch.nn.Module] = []
        for leaf in leaves:
            leaf.register_forward_hook(lambda module, _, __: ran.append(module))
        image = torch.rand(shape[1:])

        classifier.predict([image])
        calls = len(ran)  # a layer used twice (a ReLU) allocates twice
        assert calls >= len(leaves) and gpu.peak_bytes == weights + per_image  # all of it, held to the end
        assert gpu.used_bytes == weights

        ran.clear()
        gpu.set_neighbour(gpu.total_bytes - weights - per_image // 2)  # room for half a forward pass
        with pytest.raises(torch.cuda.OutOfMemoryError):
            classifier.predict([image])
        assert 0 < len(ran) < calls  # some layers computed, then an activation did not fit
        gpu.set_neighbour(0)
        assert gpu.used_bytes == weights and gpu.oom_count == 1


async def test_the_default_model_is_pretrained_and_sees_the_photo() -> None:
    """Lite0's weights, ImageNet's names and the preprocessing that matches them, checked together.

    The margin is what it is for a reason: torchvision's normalisation instead of the weights' own
    gives 0.29, and TensorFlow's centre crop puts "academic gown" first.
    """
    app = create_app(Settings())
    async with LifespanManager(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://d") as http:
            response = await http.post("/predict", files={"file": (PHOTO.name, PHOTO.read_bytes(), "image/jpeg")})
    assert response.status_code == 200
    best = response.json()["top5"][0]
    assert best["label"] == PHOTO_LABEL and best["score"] > 0.4


async def test_resnet50_stays_and_the_card_charges_the_bytes_of_the_model_that_runs() -> None:
    """ResNet-50 stays selectable, and its image costs the card more than Lite0's: bytes of the model that runs."""
    lite, resnet = (create_app(Settings(architecture=name)) for name in (DEFAULT_MODEL, "resnet50"))
    async with LifespanManager(lite), LifespanManager(resnet):
        shape = (1, 3, 224, 224)
        assert lite.state.classifier.bytes_for(shape) < resnet.state.classifier.bytes_for(shape)
        assert lite.state.classifier.gpu.used_bytes < resnet.state.classifier.gpu.used_bytes


async def test_a_batch_too_big_for_the_card_is_a_503_not_a_crash() -> None:
    settings = Settings(architecture="resnet-tiny", simulated_vram_bytes=12 * MiB, max_files=16)
    app = create_app(settings)
    async with LifespanManager(app) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(manager.app), base_url="http://d") as http:
            files = [("files", (f"{i}.png", image_bytes())) for i in range(8)]
            response = await http.post("/predict/batch", files=files)
            small = await http.post("/predict", files={"file": ("x.png", image_bytes())})
    # It ran out of memory alone: too large for the card, and the limit the others run under stays.
    assert response.status_code == 503 and response.json()["reason"] == "too_large"
    assert "retry-after" in response.headers
    assert small.status_code == 200
    assert find_gate(app).statistics().controller.epoch == 0


async def test_model_is_loaded_once_per_process(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(architecture="resnet-tiny", seed=123)
    app = create_app(settings)
    async with LifespanManager(app):
        first = app.state.classifier
    with caplog.at_level(logging.WARNING, logger="demo_service"):
        async with LifespanManager(app):  # a second start-up in the same process
            assert app.state.classifier is first
    assert "already loaded" in caplog.text


async def test_weights_and_labels_from_paths(tmp_path: Path) -> None:
    labels = [f"thing-{i}" for i in range(10)]
    (tmp_path / "labels.txt").write_text("\n".join(labels))
    trained = build_model("resnet-tiny", num_classes=10, seed=99, weights=None)
    torch.save(trained.state_dict(), tmp_path / "weights.pt")
    settings = Settings(architecture="resnet-tiny", weights=tmp_path / "weights.pt", labels=tmp_path / "labels.txt")
    app = create_app(settings)
    async with LifespanManager(app):
        loaded = app.state.classifier.model
        assert all(
            torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), trained.state_dict().values(), strict=True)
        )
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://d") as http:
            top5 = (await http.post("/predict", files={"file": ("x.png", image_bytes())})).json()["top5"]
    assert all(p["label"] in labels for p in top5)


def test_command_line() -> None:
    args = parse_args(["--port", "9000", "--simulated-vram", "2GiB", "--max-limit", "8", "--policy", "static:3"])
    settings = settings_from(args)
    assert args.host == "127.0.0.1" and args.port == 9000
    assert settings.simulated_vram_bytes == 2 * 2**30 and settings.gate == {"max_limit": 8}
    assert parse_size("768MiB") == 768 * MiB and parse_size("1.5G") == int(1.5 * 2**30) and parse_size("512") == 512
    assert parse_policy("static:3") == ("static", 3)
    for bad in ("static:0", "fixed", "static:x"):
        with pytest.raises(ValueError, match="--policy"):
            parse_policy(bad)


def test_a_short_admin_token_stops_the_demo_before_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Said at the start: under uvicorn, the gate's error while the app is built answered every request 500."""
    monkeypatch.setenv("ADAPTIVE_GATE_ADMIN_TOKEN", "short")
    with pytest.raises(SystemExit, match="ADAPTIVE_GATE_ADMIN_TOKEN: admin_token must be at least 16 characters"):
        settings_from(parse_args([]))
    assert settings_from(parse_args(["--policy", "static:4"])).policy == "static:4"  # builds no gate: no token
    with pytest.raises(SystemExit, match="a gate option: max_limit"):
        monkeypatch.delenv("ADAPTIVE_GATE_ADMIN_TOKEN")
        settings_from(parse_args(["--min-limit", "4", "--max-limit", "2"]))


def test_bad_device_is_explained() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        create_app(Settings(device="cuda:0"))


# -- the real service, as the README starts it -----------------------------------------------------


def start_demo(*python_args: str) -> tuple[subprocess.Popen[str], str]:
    """The demo as a process of its own on a free loopback port; its output kept for the failure message."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, *python_args, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return process, f"http://127.0.0.1:{port}"


def test_readme_command_serves_a_burst_and_stops_cleanly() -> None:
    process, url = start_demo("-m", "demo_service")
    try:
        wait_until_healthy(url, process, "the demo service")

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                posts = [http.post("/predict", files={"file": (f"{i}.png", image_bytes(size=(64 + i, 64)))})
                         for i in range(32)]  # fmt: skip
                return list(await asyncio_gather(posts))

        responses = anyio.run(burst)
        status = httpx.get(f"{url}/gate/status").json()
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    codes = [r.status_code for r in responses]
    assert 500 not in codes and set(codes) <= {200, 503}
    assert codes.count(200) >= 1
    for response in responses:
        if response.status_code == 503:
            assert int(response.headers["retry-after"]) >= 1
    assert status["counters"]["admitted"] + status["counters"]["rejected"] >= 32
    assert status["counters"]["completed"] == codes.count(200)
    assert status["in_flight"] == 0 and status["queued"] == 0
    assert process.returncode == 0, output
    assert "probe=SimulatedGPU" in output and "Application shutdown complete" in output


# `python -m demo_service` with an audit hook that refuses every address off this machine: the hook
# runs before the socket call, so nothing leaves, and what was refused is printed for the test to see.
OFFLINE = """
import ipaddress, runpy, sys

def loopback(host):
    if host is None or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False

def refuse_the_network(event, args):
    if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"):
        host = args[0]
    elif event in ("socket.connect", "socket.sendto"):
        address = args[1]
        host = address[0] if isinstance(address, tuple) else None  # a Unix socket's path is local
    else:
        return
    if not loopback(host):
        print(f"NETWORK REFUSED: {event} {host}", file=sys.stderr, flush=True)
        raise ConnectionRefusedError(f"offline test: {event} to {host}")

sys.addaudithook(refuse_the_network)
runpy.run_module("demo_service", run_name="__main__", alter_sys=True)
"""


def test_default_service_names_a_real_photo_offline() -> None:
    """The README's first example: the defaults, nothing from the network, a photo, ImageNet's answer."""
    process, url = start_demo("-c", OFFLINE)
    try:
        wait_until_healthy(url, process, "the demo service")
        response = httpx.post(f"{url}/predict", files={"file": (PHOTO.name, PHOTO.read_bytes(), "image/jpeg")},
                              timeout=60)  # fmt: skip
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    assert response.status_code == 200, response.text
    top3 = response.json()["top5"][:3]
    assert any(p["label"] == PHOTO_LABEL and p["score"] > 0.2 for p in top3), top3
    assert f"model={DEFAULT_MODEL}" in output and "NETWORK REFUSED" not in output, output


async def asyncio_gather(coroutines: list[object]) -> list[httpx.Response]:
    results: list[httpx.Response] = [None] * len(coroutines)  # type: ignore[list-item]

    async def run(index: int, coroutine: object) -> None:
        results[index] = await coroutine  # type: ignore[misc]

    async with anyio.create_task_group() as tg:
        for index, coroutine in enumerate(coroutines):
            tg.start_soon(run, index, coroutine)
    return results


async def test_the_limit_climbs_back_after_a_neighbour_leaves_the_demo_card() -> None:
    """As a newcomer drives the demo: clients posting images, a neighbour on the simulated card for a
    while, then gone. The limit goes down to what fits beside it, and back up once it has left (the
    first release held it at 1 after the neighbour left, bound by the OOM hold)."""
    app = create_app(Settings(architecture="resnet-tiny", gate={"sample_period": 0.02}))
    photo = image_bytes(size=(32, 32))
    async with LifespanManager(app), httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://d") as http:
        gate, gpu = find_gate(app), app.state.classifier.gpu
        per_image = app.state.classifier.bytes_for((1, 3, 224, 224))
        running = True

        async def client() -> None:
            while running:
                response = await http.post("/predict", files={"file": ("x.png", photo)})
                assert response.status_code in (200, 503), response.text

        async def limit_reaches(check: object, timeout_s: float = 20.0) -> int:
            with anyio.fail_after(timeout_s):
                while not check(gate.statistics().limit):  # type: ignore[operator]  # noqa: ASYNC110 - polled, as a user would
                    await anyio.sleep(0.02)
            return gate.statistics().limit

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(client)
            before = await limit_reaches(lambda limit: limit >= 3)
            weights = weight_bytes(app.state.classifier.model)
            gpu.set_neighbour(gpu.total_bytes - weights - int(2.5 * per_image))  # room for two images beside it
            beside = await limit_reaches(lambda limit: limit <= 2)
            gpu.set_neighbour(0)
            after = await limit_reaches(lambda limit: limit >= before)
            running = False
    assert beside <= 2 < before <= after
    assert gate.status()["controller"]["bound"] in ("memory", "max_limit")
