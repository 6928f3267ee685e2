"""adaptive-gate inside a Ray Serve deployment: one replica per GPU, each replica gating its own card.

Ray Serve runs the FastAPI app (`@serve.ingress(app)`) in each replica, middleware included, so every
replica has its own gate that learns what its GPU holds and answers 503 + Retry-After for the rest;
Ray's proxy passes that answer through to the client. Ray's autoscaler adds replicas (GPUs) on
ongoing requests: the gate keeps each card safe while the autoscaler decides how many cards.

Two settings make the two work together:

* `max_ongoing_requests` must be above what the gate can hold (its limit plus its queue): Ray
  otherwise queues in its router, where no one knows the GPU's memory, and the gate never sees
  the pressure it is there to manage.
* `target_ongoing_requests` for the autoscaler is about what one card runs well (the gate's limit
  at rest, see `/gate/status`): past it, requests queue in the gate and a new replica helps.

Run it (CPU without a GPU, on 127.0.0.1:8000):

    pip install 'adaptive-gate[ray]' torch
    python examples/ray_serve/app.py --port 8000
    curl -X POST localhost:8000/predict -H 'content-type: application/json' -d '{"rows": 64}'

Gate options come from the environment for this example (`GATE_MAX_LIMIT`, `GATE_MAX_QUEUE`), and so does
the number of replicas Ray may scale to (`MAX_REPLICAS`, 1 by default).
"""

# No `from __future__ import annotations` here: FastAPI must see the real types of the methods'
# parameters, which Ray's class-based view rebinds.
import argparse
import os
import signal
import threading
from typing import Any

import torch
from fastapi import FastAPI
from pydantic import BaseModel, Field
from ray import serve

from adaptive_gate import AdaptiveGate

FEATURES = 256
app = FastAPI(title="adaptive-gate on Ray Serve")
app.add_middleware(
    AdaptiveGate,
    max_limit=int(os.environ.get("GATE_MAX_LIMIT", "64")),
    max_queue=int(os.environ.get("GATE_MAX_QUEUE", "32")),
)


class Batch(BaseModel):
    rows: int = Field(64, ge=1, le=4096, description="rows of random features to score (a stand-in for real inputs)")


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(FEATURES if not layers else 2048, 2048), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(2048, 10))
    return torch.nn.Sequential(*layers).eval()


@serve.deployment(
    # One replica per GPU; on a machine without one, the replica runs on the CPU.
    ray_actor_options={"num_gpus": 1 if torch.cuda.is_available() else 0, "num_cpus": 1},
    max_ongoing_requests=128,  # above the gate's limit + queue: the gate queues, not Ray's router
    autoscaling_config={"min_replicas": 1, "max_replicas": int(os.environ.get("MAX_REPLICAS", "1")),
                        "target_ongoing_requests": 8},
)  # fmt: skip
@serve.ingress(app)
class Scorer:
    def __init__(self) -> None:
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = build_model().to(self.device)
        with torch.inference_mode():  # warm up before the first request, not during it
            self.model(torch.zeros(1, FEATURES, device=self.device))

    @app.post("/predict", tags=["gpu"])
    def predict(self, batch: Batch) -> dict[str, Any]:
        with torch.inference_mode():
            features = torch.randn(batch.rows, FEATURES, device=self.device)
            scores = self.model(features).softmax(dim=1)
        return {"rows": batch.rows, "top_class": scores.argmax(dim=1)[:8].tolist()}

    @app.get("/healthz")
    def healthz(self) -> dict[str, bool]:
        return {"ok": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()

    import ray

    # A local Ray for this example, on loopback; on a cluster, `ray.init(address="auto")` instead.
    ray.init(include_dashboard=False, num_cpus=max(2, os.cpu_count() or 2), _node_ip_address="127.0.0.1")
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(Scorer.bind(), name="scorer", route_prefix="/")
    print(f"serving on http://{args.host}:{args.port}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
