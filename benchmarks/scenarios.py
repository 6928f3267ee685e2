"""The scenarios and loads the policies are compared on, and what an oracle would set in each."""

from __future__ import annotations

import math
import random

from .model import GiB, Phase, Scenario, Size


def small_and_large(rng: random.Random) -> int:
    return 6 * GiB if rng.random() < 0.25 else int(1.5 * GiB)


def cost_in_small_requests(nbytes: int) -> float:
    """What a client of the mixed-cost scenario says its request weighs (pixels, say): 1 or 4."""
    return nbytes / (1.5 * GiB)


def now_and_then_too_large(rng: random.Random) -> int:
    """One request in twelve asks for 20 GiB, which no card of 24 GiB with 8 GiB of weights holds."""
    return 20 * GiB if rng.random() < 1 / 12 else 3 * GiB


BATCH_WORKSPACE_BYTES = 3 * GiB // 2  # what a batch holds whatever its size
IMAGE_BYTES = GiB // 4  # and what each image in it adds


def batch_of_images(rng: random.Random) -> int:
    """The batches scenario: a batch of 1 to 8 images, its workspace and its images' activations."""
    return BATCH_WORKSPACE_BYTES + rng.randint(1, 8) * IMAGE_BYTES


def images_in_batch(nbytes: int) -> float:
    """What a client of the batches scenario says its request weighs: its batch size, as users tell it."""
    return float(round((nbytes - BATCH_WORKSPACE_BYTES) / IMAGE_BYTES))


def route_by_size(nbytes: int) -> str:
    """The mixed-routes scenario: large requests have an endpoint of their own (a batch route, say)."""
    return "/infer/large" if nbytes > 3 * GiB else "/infer"


def oracle_limits(scenario: Scenario) -> list[tuple[float, int]] | None:
    """(from fraction, limit) for a semaphore resized the moment the card changes to exactly what fits
    then; None where sizes are drawn (the oracle is then the best static-N, which knows the mix)."""
    limits = []
    for phase in scenario.phases:
        if not isinstance(phase.request_bytes, Size):
            return None
        room_bytes = scenario.total_bytes - scenario.weights_bytes - phase.neighbour_bytes
        limits.append((phase.at_fraction, max(1, math.floor(room_bytes / phase.request_bytes.nbytes))))
    return limits


THREE_GIB = Size(3 * GiB)


def middle_third(size: Size, neighbour_bytes: int, step_bytes: int = 0) -> list[Phase]:
    """Requests of `size` throughout; a neighbour holds `neighbour_bytes` for the middle third
    (growing by `step_bytes` whenever that much is free, where given), then leaves."""
    return [Phase(0.0, size), Phase(1 / 3, size, neighbour_bytes, step_bytes), Phase(2 / 3, size)]


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in [
        Scenario("classic", "24 GiB card, 8 GiB of weights, 3 GiB per request: five fit", [Phase(0.0, THREE_GIB)]),
        Scenario(
            "neighbour",
            "classic; a neighbour process takes 6 GiB for the middle third (three fit), then leaves",
            middle_third(THREE_GIB, 6 * GiB),
            crash_s=1.0,
        ),
        Scenario(
            "neighbour-greedy",
            "classic; for the middle third a neighbour grows in 512 MiB steps whenever that much is free, "
            "as a second PyTorch process's caching allocator does, up to 6 GiB (three fit), then leaves",
            middle_third(THREE_GIB, 6 * GiB, GiB // 2),
            crash_s=1.0,
        ),
        Scenario(
            "growth",
            "classic, then inputs that need 6 GiB from half-way on (two fit)",
            [Phase(0.0, THREE_GIB), Phase(0.5, Size(6 * GiB))],
            crash_s=1.0,
        ),
        Scenario(
            "mixed",
            "a quarter large requests (6 GiB), the rest small (1.5 GiB); the gate cannot tell them apart",
            [Phase(0.0, small_and_large)],
        ),
        Scenario(
            "mixed-cost",
            "mixed, where each request says what it weighs (the gate's `cost` hook: 4 for a large one, 1 for "
            "a small one)",
            [Phase(0.0, small_and_large)],
            cost=cost_in_small_requests,
        ),
        Scenario(
            "mixed-routes",
            "mixed, where the large requests take a route of their own; the gate is told nothing and "
            "learns each route's weight from the readings",
            [Phase(0.0, small_and_large)],
            route=route_by_size,
        ),
        Scenario(
            "mixed-routes-tight",
            "mixed-routes on a card with room for about five of the mix (24 GiB, 11.5 GiB of weights): a slot is "
            "the mean request, and what is left of the room is a large share of one",
            [Phase(0.0, small_and_large)],
            weights_bytes=int(11.5 * GiB),
            capacity_per_s=40.0,
            route=route_by_size,
        ),
        Scenario(
            "batches",
            "batches of 1 to 8 images, told through `cost` as their size: each holds 1.5 GiB of workspace and "
            "0.25 GiB an image, so its bytes are not in proportion to its cost (a batch of 8 holds 2.3 of 1)",
            [Phase(0.0, batch_of_images)],
            cost=images_in_batch,
        ),
        Scenario(
            "batches-late",
            "batches, each allocating up to 50 ms after it is admitted (its images decoded first): readings "
            "catch some of those in flight holding nothing yet",
            [Phase(0.0, batch_of_images)],
            cost=images_in_batch,
            start_delay_s=0.05,
        ),
        Scenario(
            "classic-crash",
            "classic, where an OOM kills the worker for 2 s (as an unrecoverable CUDA error does)",
            [Phase(0.0, THREE_GIB)],
            crash_s=2.0,
        ),
        Scenario(
            "no-lifespan",
            "classic, served without a lifespan (TestClient without `with`, uvicorn --lifespan off)",
            [Phase(0.0, THREE_GIB)],
            lifespan=False,
        ),
        Scenario(
            "exact-fit",
            "classic; a neighbour takes 7 GiB for the middle third, so that three fit with nothing to spare",
            middle_third(THREE_GIB, 7 * GiB),
            crash_s=1.0,
        ),
        Scenario(
            "small-card",
            "a 16 GiB card, 4 GiB of weights, 2 GiB per request (six fit); a neighbour takes 5 GiB for the "
            "middle third (three fit)",
            middle_third(Size(2 * GiB), 5 * GiB),
            total_bytes=16 * GiB,
            weights_bytes=4 * GiB,
            capacity_per_s=60.0,
            crash_s=1.0,
        ),
        Scenario(
            "shrink",
            "inputs that need 6 GiB (two fit), then 3 GiB from half-way on (five fit)",
            [Phase(0.0, Size(6 * GiB)), Phase(0.5, THREE_GIB)],
            capacity_per_s=20.0,
            crash_s=1.0,
        ),
        Scenario(
            "fragmented",
            "classic on a fragmented card: an allocation may fail up to 5% of it below the total, so five "
            "fit by the readings and now and then do not",
            [Phase(0.0, THREE_GIB)],
            fragmentation=0.05,
            crash_s=1.0,
        ),
        Scenario(
            "jitter",
            "classic, where each request's time varies (half of 0.1 s and up) whatever runs beside it: "
            "latency noise that more at once does not cause",
            [Phase(0.0, THREE_GIB)],
            knee=math.inf,
            jitter=True,
        ),
        Scenario(
            "small-neighbour",
            "an 80 GiB card, 34 GiB of weights, 4.7 GiB per request that takes 50 ms (nine fit); a neighbour "
            "smaller than one request (4.2 GiB) for the middle third (eight fit); an OOM does not take the "
            "worker down",
            middle_third(Size(int(4.7 * GiB)), int(4.2 * GiB)),
            total_bytes=80 * GiB,
            weights_bytes=34 * GiB,
            work_s=0.05,
            capacity_per_s=180.0,
        ),
        Scenario(
            "two-neighbours",
            "4 GiB per request (four fit); a neighbour takes 2.5 GiB from a quarter of the run (three fit), "
            "a second one 3.5 GiB more from half-way (two fit), both leave at three quarters",
            [
                Phase(0.0, Size(4 * GiB)),
                Phase(0.25, Size(4 * GiB), int(2.5 * GiB)),
                Phase(0.5, Size(4 * GiB), 6 * GiB),
                Phase(0.75, Size(4 * GiB)),
            ],
            weights_bytes=int(6.5 * GiB),
            work_s=0.2,
            capacity_per_s=20.0,
            crash_s=1.0,
        ),
        Scenario(
            "survived-neighbour",
            "a 40 GiB card, 19 GiB of weights, 2.4 GiB per request that takes 0.2 s (eight fit); a neighbour "
            "takes 12 GiB for the middle third (three fit), and an OOM does not take the worker down: the "
            "requests admitted before the first one run out too",
            middle_third(Size(int(2.4 * GiB)), 12 * GiB),
            total_bytes=40 * GiB,
            weights_bytes=19 * GiB,
            work_s=0.2,
            capacity_per_s=40.0,
        ),
        Scenario(
            "late-start",
            "classic, where each request allocates up to 50 ms after it is admitted (its input decoded on "
            "the CPU first, or its handler run late by a loaded event loop): readings catch some of those in "
            "flight holding nothing yet",
            [Phase(0.0, THREE_GIB)],
            start_delay_s=0.05,
            crash_s=1.0,
        ),
        Scenario(
            "decode-first",
            "classic, where each request decodes its input on the CPU for up to three times its GPU work "
            "(0.3 s) before it allocates: most readings catch some of those in flight holding nothing",
            [Phase(0.0, THREE_GIB)],
            start_delay_s=0.3,
            capacity_per_s=20.0,  # five at once, each holding its slot 0.25 s on average
            crash_s=1.0,
        ),
        Scenario(
            "too-large",
            "classic, where one request in twelve asks for 20 GiB, which never fits, even alone",
            [Phase(0.0, now_and_then_too_large)],
        ),
    ]
}

# load name -> (multiple of capacity for open loop, or None; closed-loop clients, or None)
LOADS: dict[str, tuple[float | None, int | None]] = {
    "0.5x": (0.5, None),
    "1x": (1.0, None),
    "2x": (2.0, None),
    "4x": (4.0, None),
    "closed-16": (None, 16),
    "closed-32": (None, 32),
}

FULL_PLAN: dict[str, list[str]] = {
    "classic": ["0.5x", "1x", "2x", "4x", "closed-16"],
    "neighbour": ["2x", "closed-32"],
    "neighbour-greedy": ["2x", "closed-32"],
    "growth": ["2x", "closed-32"],
    "exact-fit": ["closed-32"],
    "jitter": ["closed-32"],
    "mixed": ["2x"],
    "mixed-cost": ["2x"],
    "batches": ["2x", "closed-32"],
    "mixed-routes": ["2x"],
    "classic-crash": ["2x"],
    "no-lifespan": ["closed-32"],
    "late-start": ["2x", "closed-32"],
    "decode-first": ["2x", "closed-32"],
}
QUICK_PLAN: dict[str, list[str]] = FULL_PLAN | {"classic": ["1x", "4x"]}
FULL_STATIC = [1, 2, 3, 4, 5, 6]
QUICK_STATIC = [3, 4, 5]
# Where the card changes under the service: adaptive must beat every static-N there.
CHANGING = {"neighbour", "neighbour-greedy", "growth"}
