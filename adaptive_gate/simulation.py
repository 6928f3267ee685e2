"""A deterministic replay of the gate on virtual time: the gate's own core, a simulated card, arrivals.

No real sleep happens here: an hour of traffic replays in well under a second, and the same seed
gives the same run. This is the controller's regression suite (the scenario tests assert ranges on
its output) and a quick way to try controller settings against a card before deploying them.

The model: requests arrive as a Poisson process per `Phase`; each one goes to the same `GateCore`
the middleware drives (admitted, queued with a deadline, or turned away), allocates its bytes on a
`SimulatedGPU` when admitted (an out-of-memory error fails it at once), then computes for `work_s`
under processor sharing past the card's `knee`. A sampler reads the card every `sample_period_s`.
What happens is told to the core exactly as the middleware tells it; nothing of the gate's wiring
is copied here. `record=True` keeps the events told, for replaying them through the middleware.
"""

from __future__ import annotations

import math

from ._checks import check_int, check_number, check_real, check_seconds
from ._control.control import AIMD, Controller
from ._gate.core import GateCore
from ._simulation.run import CLIENT_PAUSE_S, Phase, Run, SimulationResult
from .testing import SimulatedGPU

__all__ = ["CLIENT_PAUSE_S", "Phase", "SimulationResult", "simulate"]


def simulate(
    phases: list[Phase],
    *,
    total_bytes: int,
    baseline_bytes: int,
    duration_s: float,
    controller: Controller | None = None,
    min_limit: int = 1,
    max_limit: int = 64,
    initial_limit: int | None = None,
    max_queue: int = 128,
    queue_timeout_s: float = 30.0,
    knee: float = math.inf,
    sample_period_s: float = 0.1,
    seed: int = 0,
    record: bool = False,
    oom_after_fraction: float = 0.0,
    crash_s: float = 0.0,
    clients: int | None = None,
    gpu: SimulatedGPU | None = None,
    start_delay_s: float = 0.0,
) -> SimulationResult:
    """`oom_after_fraction`: how far into its work a request that does not fit runs out of memory
    (0: at once; the work done until then is lost, and its slot held). `crash_s` > 0: an OOM takes
    the worker down for so long, as a CUDA error that poisons the context does: the requests it ran
    then and those admitted meanwhile fail (`crashed`). `clients`: a closed loop of so many clients,
    each sending its next request when its last one is answered (`CLIENT_PAUSE_S` after a refusal),
    instead of the phases' Poisson arrivals. `gpu`: the card to run on (by default a new one of
    `total_bytes`, `baseline_bytes` of it taken), for a caller that looks at it while it runs.
    `start_delay_s` > 0: each admitted request allocates after a delay drawn up to so long, holding
    nothing meanwhile, as one does on a loaded event loop (its handler runs late) or while it
    decodes its input on the CPU; its work starts then."""
    # A number that would make no run fails here (an endless or NaN duration, or readings every 0 s, hung)
    check_number("duration_s", duration_s, allow_zero=False, finite=True)
    check_number("sample_period_s", sample_period_s, allow_zero=False, finite=True)
    check_number("start_delay_s", start_delay_s, finite=True)  # an endless delay would hold its slot for good
    check_seconds("queue_timeout_s", queue_timeout_s)
    check_seconds("crash_s", crash_s)
    if not check_real("knee", knee, "a number of requests at full speed (math.inf: no knee)") > 0:  # NaN too
        raise ValueError(f"knee must be > 0 requests at full speed (math.inf: no knee), got {knee!r}")
    if not 0 <= oom_after_fraction <= 1:
        raise ValueError(f"oom_after_fraction must be within [0, 1] of a request's work, got {oom_after_fraction!r}")
    if clients is not None:
        check_int("clients (None: the phases' open loop)", clients, 1)
    run = Run(phases, total_bytes, baseline_bytes, duration_s, queue_timeout_s, knee, sample_period_s, seed, record)
    if gpu is not None:
        run.gpu = gpu
    run.oom_after_fraction = oom_after_fraction
    run.crash_s = crash_s
    run.clients = clients
    run.start_delay_s = start_delay_s
    run.core = GateCore(
        controller or AIMD(),
        min_limit=min_limit,
        max_limit=max_limit,
        initial_limit=initial_limit,
        max_queue=max_queue,
        max_retry_after_s=60,
        seed=seed,
    )
    run.core.limit_listeners.append(run.limit_changed)
    return run.run()
