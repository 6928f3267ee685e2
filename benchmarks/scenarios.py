"""The scenarios and loads the policies are compared on."""

from __future__ import annotations

import random
from collections.abc import Callable

from .harness import GiB, Phase, Scenario


def fixed(nbytes: int) -> Callable[[random.Random], int]:
    return lambda _: nbytes


def small_and_large(rng: random.Random) -> int:
    return 6 * GiB if rng.random() < 0.25 else int(1.5 * GiB)


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in [
        Scenario(
            "classic",
            "24 GiB card, 8 GiB of weights, 3 GiB per request: five fit",
            [Phase(0.0, fixed(3 * GiB))],
        ),
        Scenario(
            "neighbour",
            "classic; a neighbour process takes 6 GiB for the middle third (three fit), then leaves",
            [Phase(0.0, fixed(3 * GiB)), Phase(1 / 3, fixed(3 * GiB), 6 * GiB), Phase(2 / 3, fixed(3 * GiB))],
        ),
        Scenario(
            "growth",
            "classic, then inputs that need 6 GiB from half-way on (two fit)",
            [Phase(0.0, fixed(3 * GiB)), Phase(0.5, fixed(6 * GiB))],
        ),
        Scenario(
            "mixed",
            "a quarter large requests (6 GiB), the rest small (1.5 GiB)",
            [Phase(0.0, small_and_large)],
        ),
        Scenario(
            "classic-crash",
            "classic, where an OOM kills the worker for 2 s (as an unrecoverable CUDA error does)",
            [Phase(0.0, fixed(3 * GiB))],
            crash_on_oom=True,
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
}

FULL_PLAN: dict[str, list[str]] = {
    "classic": ["0.5x", "1x", "2x", "4x", "closed-16"],
    "neighbour": ["2x"],
    "growth": ["2x"],
    "mixed": ["2x"],
    "classic-crash": ["2x"],
}
QUICK_PLAN: dict[str, list[str]] = {
    "classic": ["1x", "4x"],
    "neighbour": ["2x"],
    "growth": ["2x"],
    "mixed": ["2x"],
    "classic-crash": ["2x"],
}
FULL_STATIC = [1, 2, 3, 4, 5, 6]
QUICK_STATIC = [3, 4, 5]
