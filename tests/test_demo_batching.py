"""The demo's `/predict` through `adaptive_gate.batch` (`--batching on`), on the CPU and the simulated card."""

from __future__ import annotations

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager

from demo_service import Settings, create_app
from demo_service.__main__ import parse_args, settings_from
from demo_service.batching import batching_on

from .helpers import image_bytes

pytestmark = pytest.mark.anyio


async def test_predict_with_batching_on_answers_each_caller_and_the_gate_shows_the_batches() -> None:
    app = create_app(Settings(architecture="resnet-tiny", batching="on"))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://demo", timeout=60) as client:
            answers: list[httpx.Response] = []

            async def one(i: int) -> None:
                files = {"file": (f"{i}.png", image_bytes(size=(30 + i, 30)))}
                answers.append(await client.post("/predict", files=files))

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
            bad = await client.post("/predict", files={"file": ("a.txt", b"not an image")})
            status = (await client.get("/gate/status")).json()
    assert [a.status_code for a in answers] == [200] * 8
    for answer in answers:
        body = answer.json()
        assert len(body["top5"]) == 5 and body["batch_size"] >= 1 and body["inference_ms"] > 0
    assert bad.status_code == 400  # decoded before the batch: a bad file fails alone
    assert status["controller"]["batching"]["items"] == 8
    assert status["controller"]["batching"]["probe"] == "probe: the gate's sampler"  # one view of the card


def test_batching_is_on_for_cuda_and_off_on_the_cpu_by_default() -> None:
    import torch

    assert batching_on("auto", torch.device("cuda:0")) and not batching_on("auto", torch.device("cpu"))
    assert batching_on("on", torch.device("cpu")) and not batching_on("off", torch.device("cuda:0"))
    with pytest.raises(ValueError, match="--batching"):
        batching_on("yes", torch.device("cpu"))
    assert settings_from(parse_args(["--batching", "on"])).batching == "on"
    assert settings_from(parse_args([])).batching == "auto"
