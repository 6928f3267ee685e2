"""`adaptive_gate.batch`: answers to the right callers on every path, OOM splits, the card followed."""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import threading
import time
import traceback
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from adaptive_gate import AdaptiveGate, Batched, Fixed, batch, is_oom
from adaptive_gate.testing import SimulatedGPU

pytestmark = pytest.mark.anyio

MiB = 2**20
GiB = 2**30


class BadInput(Exception):
    pass


async def gather(batched: Any, items: list[Any]) -> list[Any]:
    """Await every item at once; each slot gets the result or the exception its caller saw."""
    answers: list[Any] = [None] * len(items)

    async def one(i: int) -> None:
        try:
            answers[i] = await batched(items[i])
        except Exception as exc:
            answers[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(len(items)):
            tg.start_soon(one, i)
    return answers


async def test_each_caller_gets_its_own_result_in_batches() -> None:
    sizes: list[int] = []

    @batch(probe=None, max_wait_s=0.05, max_batch_size=8)
    async def double(items: list[int]) -> list[int]:
        sizes.append(len(items))
        await anyio.lowlevel.checkpoint()
        return [2 * x for x in items]

    for _ in range(5):  # the knee starts at one item and must see batches before it allows more
        assert await gather(double, list(range(20))) == [2 * x for x in range(20)]
    assert max(sizes) > 1
    stats = double.statistics()
    assert stats.items == 100 and stats.failed_items == 0 and stats.queued == 0


async def test_sync_function_runs_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    @batch(probe=None, max_wait_s=0.0)
    def where(items: list[int]) -> list[int]:
        threads.append(threading.get_ident())
        return items

    assert await gather(where, [1, 2, 3]) == [1, 2, 3]
    assert threads and loop_thread not in threads


async def test_an_exception_in_place_of_a_result_goes_to_its_caller_alone() -> None:
    @batch(probe=None, max_wait_s=0.05, max_batch_size=4)
    def parse(items: list[str]) -> list[Any]:
        return [BadInput(item) if item.startswith("bad") else item.upper() for item in items]

    answers = await gather(parse, ["a", "bad1", "c", "bad2"])
    assert answers[0] == "A" and answers[2] == "C"
    assert isinstance(answers[1], BadInput) and str(answers[1]) == "bad1"
    assert isinstance(answers[3], BadInput) and str(answers[3]) == "bad2"


async def test_an_error_of_the_whole_batch_reaches_every_caller_of_it() -> None:
    @batch(probe=None, max_wait_s=0.05)
    def broken(items: list[int]) -> list[int]:
        raise BadInput("the model is broken")

    answers = await gather(broken, [1, 2, 3])
    assert all(isinstance(a, BadInput) for a in answers)
    assert broken.statistics().failed_items == 3


async def test_every_caller_of_a_failed_batch_gets_the_error_with_its_own_traceback() -> None:
    @batch(probe=None, max_wait_s=0.05, max_batch_size=8)
    async def broken(items: list[int]) -> list[int]:
        raise BadInput(f"a batch of {len(items)} failed")

    broken.policy.knee.group = 3  # batches of several: one error for several callers
    frames: list[int] = []

    async def one(i: int) -> None:
        try:
            await broken(i)
        except BadInput as exc:
            frames.append(len(traceback.extract_tb(exc.__traceback__)))

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    assert broken.statistics().batches == 0 and broken.statistics().failed_items == 6
    assert len(frames) == 6 and len(set(frames)) == 1, f"the traceback grew from caller to caller: {frames}"


@pytest.mark.parametrize("returned", [lambda items: items[:-1], lambda items: [*items, 0], lambda _: "ab", lambda _: 5])
async def test_a_wrong_number_of_results_is_a_clear_error_to_every_caller(returned: Any) -> None:
    @batch(probe=None, max_wait_s=0.05, max_batch_size=2)
    def wrong(items: list[int]) -> Any:
        return returned(items)

    answers = await gather(wrong, [1, 2])
    for answer in answers:
        assert isinstance(answer, TypeError)
        assert "one result per item" in str(answer)


@pytest.mark.parametrize("seed", [13, 14, 15])
async def test_chaos_cancellations_and_bad_inputs_answers_reach_the_right_callers(seed: int) -> None:
    rng = random.Random(seed)
    calls: list[list[int]] = []

    @batch(probe=None, max_wait_s=0.002, max_batch_size=6)
    async def square(items: list[int]) -> list[Any]:
        calls.append(list(items))
        await anyio.sleep(0.001 * rng.random())
        return [BadInput(x) if x % 7 == 0 else x * x for x in items]

    seen: dict[int, Any] = {}
    cancelled: set[int] = set()

    async def caller(i: int) -> None:
        await anyio.sleep(0.003 * rng.random())
        with anyio.CancelScope() as scope:
            if rng.random() < 0.3:
                scope.deadline = anyio.current_time() + 0.004 * rng.random()
            try:
                seen[i] = await square(i)
            except BadInput as exc:
                seen[i] = exc
        if scope.cancelled_caught:
            cancelled.add(i)

    async with anyio.create_task_group() as tg:
        for i in range(1, 300):
            tg.start_soon(caller, i)

    for i, answer in seen.items():
        if i % 7 == 0:
            assert isinstance(answer, BadInput) and answer.args == (i,)
        else:
            assert answer == i * i
    assert set(seen) | cancelled == set(range(1, 300))
    flat = [x for call in calls for x in call]
    assert len(flat) == len(set(flat)), "an item ran twice"
    assert set(seen) <= set(flat)
    stats = square.statistics()
    assert stats.queued == 0 and stats.running == 0
    assert square._leader is None  # nothing holds the lead once every caller is gone


async def test_a_cancelled_leader_does_not_cancel_the_batch_for_the_others() -> None:
    started, release = anyio.Event(), anyio.Event()

    @batch(probe=None, max_wait_s=0.05, max_batch_size=3)
    async def slow(items: list[int]) -> list[int]:
        started.set()
        await release.wait()
        return [x + 1 for x in items]

    for _ in range(3):  # past the knee's first group, so that three may go together
        release.set()
        await gather(slow, [0, 0, 0])
    release = anyio.Event()
    started = anyio.Event()
    results: dict[int, int] = {}
    outcome: dict[str, Any] = {}
    leader_scope = anyio.CancelScope()

    async def follower(i: int) -> None:
        results[i] = await slow(i)

    async def lead() -> None:
        with leader_scope:  # the scope holds the leader's own await, so cancelling it reaches the leader
            outcome["result"] = await slow(100)
            await anyio.lowlevel.checkpoint()  # where the cancellation, held while the batch ran, lands
            outcome["after"] = "not cancelled"
        outcome["cancelled"] = leader_scope.cancelled_caught

    async with anyio.create_task_group() as tg:
        tg.start_soon(lead)
        await anyio.lowlevel.checkpoint()  # the leader is in the line first
        tg.start_soon(follower, 1)
        tg.start_soon(follower, 2)
        await started.wait()
        leader_scope.cancel()
        release.set()
    assert results == {1: 2, 2: 3}
    assert outcome == {"result": 101, "cancelled": True}


@pytest.mark.parametrize("how", ["asyncio.timeout", "task.cancel"])
async def test_a_leader_cancelled_by_plain_asyncio_still_answers_its_batch_and_runs_one_at_a_time(how: str) -> None:
    started, release = threading.Event(), threading.Event()
    running, most = [0], [0]

    @batch(probe=None, max_wait_s=0.05, max_batch_size=3)
    def slow(items: list[int]) -> list[int]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        started.set()
        release.wait(30)
        running[0] -= 1
        return [x + 1 for x in items]

    release.set()
    for _ in range(3):
        await gather(slow, [0, 0, 0])
    release.clear()
    started.clear()
    timeouts: list[asyncio.Timeout] = []

    async def lead() -> int:
        async with asyncio.timeout(None) as timeout:
            timeouts.append(timeout)
            result: int = await slow(100)
            return result

    leader = asyncio.ensure_future(lead())
    await asyncio.sleep(0)  # the leader is in the line first
    mates = [asyncio.ensure_future(slow(i)) for i in (1, 2)]
    await anyio.to_thread.run_sync(started.wait)  # its batch runs in the worker thread
    if how == "task.cancel":
        leader.cancel()
    else:
        timeouts[0].reschedule(asyncio.get_running_loop().time())  # what asyncio.wait_for does at its timeout
    await asyncio.sleep(0.01)
    late = asyncio.ensure_future(slow(3))  # after the leader's cancellation: must wait for the batch
    await asyncio.sleep(0.01)
    release.set()
    assert await asyncio.gather(*mates, late) == [2, 3, 4]
    with pytest.raises(asyncio.CancelledError if how == "task.cancel" else TimeoutError):
        await leader
    assert most[0] == 1, "two batches ran at once"
    assert slow.statistics().failed_items == 0 and slow._leader is None


async def test_cancelled_while_waiting_leaves_the_line_and_passes_the_lead() -> None:
    ran: list[int] = []

    @batch(probe=None, max_wait_s=0.01, max_batch_size=1000)
    async def echo(items: list[int]) -> list[int]:
        ran.extend(items)
        return items

    echo.policy.knee.group = 3  # as if the knee had learned that batches pay: a lone item waits for company
    assert echo.statistics().batch_size > 1
    echo.max_wait_s = 10.0
    with anyio.move_on_after(0.01):
        await echo(1)  # alone, it waits for its batch to fill; cancelled meanwhile
    stats = echo.statistics()
    assert stats.queued == 0 and stats.cancelled == 1 and echo._leader is None
    echo.max_wait_s = 0.0
    assert await echo(2) == 2  # the lead was not lost with the cancelled caller
    assert 1 not in ran


async def test_cancelled_behind_a_running_batch_never_runs() -> None:
    release = anyio.Event()
    ran: list[int] = []

    @batch(probe=None, max_wait_s=0.0)
    async def held(items: list[int]) -> list[int]:
        ran.extend(items)
        await release.wait()
        return items

    async with anyio.create_task_group() as tg:
        tg.start_soon(held, 1)
        await anyio.sleep(0.01)
        with anyio.move_on_after(0.01):
            await held(2)  # waits behind the running batch; leaves
        release.set()
    assert ran == [1]
    assert held.statistics().cancelled == 1 and held.statistics().queued == 0 and held._leader is None


def card_batch(gpu: SimulatedGPU, *, item_bytes: int, workspace_bytes: int, seconds: float = 0.0) -> Any:
    """A batched function whose batch of n holds n * item_bytes + workspace_bytes on the card."""
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        sizes.append(len(items))
        with gpu.allocate(workspace_bytes + item_bytes * len(items)):
            time.sleep(seconds)
        return [x + 1 for x in items]

    batched = batch(probe=gpu, max_wait_s=0.02)(run)
    batched.sizes = sizes  # type: ignore[attr-defined]
    return batched


async def test_a_batch_that_runs_out_of_memory_is_split_and_no_caller_fails() -> None:
    gpu = SimulatedGPU(2 * GiB, baseline_bytes=200 * MiB)
    fn = card_batch(gpu, item_bytes=100 * MiB, workspace_bytes=100 * MiB, seconds=0.002)
    for _ in range(6):  # the policy learns a batch fits 16
        assert await gather(fn, list(range(40))) == list(range(1, 41))
    assert fn.statistics().batch_size >= 12
    gpu.set_neighbour(1200 * MiB)  # arrives between readings: the next batch does not fit
    fn.policy.reading(0.0, 200 * MiB, 2 * GiB)  # as if the reading before it had been taken just before
    fn._probe.read = _no_reading  # type: ignore[method-assign]
    answers = await gather(fn, list(range(40)))
    assert answers == list(range(1, 41))
    stats = fn.statistics()
    assert stats.splits >= 1 and stats.failed_items == 0 and stats.ooms == 0


async def _no_reading() -> None:
    return None


async def test_an_item_too_large_alone_fails_with_the_oom() -> None:
    gpu = SimulatedGPU(1 * GiB, baseline_bytes=200 * MiB)
    fn = card_batch(gpu, item_bytes=2 * GiB, workspace_bytes=0)
    answers = await gather(fn, [1, 2])
    assert all(is_oom(a) for a in answers)
    assert fn.statistics().ooms == 2


async def test_an_item_too_large_alone_teaches_nothing_about_the_batch_size() -> None:
    gpu = SimulatedGPU(1 * GiB)

    @batch(probe=None, max_wait_s=0.05, max_batch_size=8)
    def run(items: list[Any]) -> list[Any]:
        with gpu.allocate(sum({"poison": 2 * GiB, "big": 400 * MiB}.get(x, MiB) for x in items)):
            pass
        return items

    run.policy.knee.group = 3  # batches of several
    answers = await gather(run, [1, "poison", 3, 4])
    assert is_oom(answers[1]) and answers[0] == 1 and answers[2:] == [3, 4]
    assert await gather(run, ["poison"]) and run.statistics().splits >= 1
    assert run.statistics().bound != "oom" and run.statistics().batch_size == 8, "one caller turned batching off"
    answers = await gather(run, ["big"] * 4)  # a batch too large for the card, every item fits alone: a lesson
    assert answers == ["big"] * 4 and run.statistics().bound == "oom"


async def test_batch_sizes_follow_a_neighbour_arriving_and_leaving() -> None:
    # 2 GiB card, 200 MiB taken, 100 MiB per item and per batch: about 16 fit, 6 beside 1 GiB.
    gpu = SimulatedGPU(2 * GiB, baseline_bytes=200 * MiB)
    fn = card_batch(gpu, item_bytes=100 * MiB, workspace_bytes=100 * MiB, seconds=0.01)

    async def rounds(n: int) -> list[int]:
        del fn.sizes[:]
        for _ in range(n):
            assert await gather(fn, list(range(40))) == list(range(1, 41))
        return list(fn.sizes[-10:])

    alone = await rounds(8)
    gpu.set_neighbour(1 * GiB)
    beside = await rounds(4)
    gpu.set_neighbour(0)
    after = await rounds(4)
    assert max(alone) >= 14 and max(alone) <= 16
    assert max(beside) <= 6 and fn.statistics().failed_items == 0
    assert max(after) >= 14
    assert gpu.oom_count == 0  # the reading before each batch saw the neighbour come and go


async def test_the_gate_in_front_lets_batches_of_several_form() -> None:
    gpu = SimulatedGPU(2 * GiB, baseline_bytes=200 * MiB)
    fn = card_batch(gpu, item_bytes=100 * MiB, workspace_bytes=100 * MiB, seconds=0.01)

    async def predict(request: Request) -> JSONResponse:
        return JSONResponse({"y": await fn(int(request.query_params["x"]))})

    app = Starlette(routes=[Route("/predict", predict, methods=["POST"])])
    gate = AdaptiveGate(app, tag=None, probe=None, controller=fn.gate_controller(), max_limit=64)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://test") as client:
        for _ in range(6):
            responses = await gather(lambda x: client.post(f"/predict?x={x}"), list(range(32)))
            assert [r.json()["y"] for r in responses] == list(range(1, 33))
        status = (await client.get("/gate/status")).json()
        metrics = (await client.get("/gate/metrics")).text
    assert max(fn.sizes) >= 8
    assert status["limit"] >= 16
    assert status["controller"]["batching"]["items"] == 6 * 32
    samples = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert samples["adaptive_gate_batch_items_total"] == 6 * 32
    assert samples["adaptive_gate_batch_size"] == status["controller"]["batching"]["batch_size"]
    assert samples["adaptive_gate_batch_splits_total"] == 0
    # The figures of `statistics()`, all of them: cancelled callers and the learned bytes too
    batching, stats = status["controller"]["batching"], fn.statistics()
    assert batching["cancelled"] == stats.cancelled == samples["adaptive_gate_batch_cancelled_total"] == 0
    assert batching["bytes_per_unit"] == stats.policy["bytes_per_unit"] == samples["adaptive_gate_batch_bytes_per_unit"]
    assert batching["workspace_bytes"] == stats.policy["workspace_bytes"] is not None


async def test_a_fixed_gate_limit_caps_what_reaches_the_batcher() -> None:
    # The comparison the docs draw: a gate that counts GPU calls, not items, starves the batcher.
    fn = card_batch(SimulatedGPU(2 * GiB), item_bytes=MiB, workspace_bytes=0, seconds=0.005)

    async def predict(request: Request) -> JSONResponse:
        return JSONResponse({"y": await fn(1)})

    app = Starlette(routes=[Route("/p", predict, methods=["POST"])])
    gate = AdaptiveGate(app, tag=None, probe=None, controller=Fixed(2))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://test") as client:
        for _ in range(4):
            await gather(lambda _: client.post("/p"), list(range(16)))
    assert max(fn.sizes) <= 2


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"max_wait_s": -1}, ValueError, "max_wait_s"),
        ({"max_wait_s": math.inf}, ValueError, "max_wait_s must be at most 60 seconds"),
        ({"max_wait_s": 3600}, ValueError, "max_wait_s must be at most 60 seconds"),
        ({"max_batch_size": 0}, ValueError, "max_batch_size"),
        ({"max_batch_size": 2.5}, TypeError, "max_batch_size"),
        ({"probe": "nvml"}, TypeError, 'probe must be "auto"'),
        ({"cost": 3}, TypeError, "cost must be"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs: dict[str, Any], error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        batch(**kwargs)
    options: dict[str, Any] = {"max_wait_s": 0.0, "max_batch_size": None, "probe": None, "cost": None} | kwargs
    with pytest.raises(error, match=words):  # Batched built directly checks the same
        Batched(lambda items: items, **options)


def test_batch_without_parentheses_says_to_add_them() -> None:
    with pytest.raises(TypeError, match=r"@adaptive_gate.batch\(\)"):

        @batch
        def echo(items: list[int]) -> list[int]:
            return items


async def test_a_bad_cost_fails_that_caller_alone() -> None:
    @batch(probe=None, max_wait_s=0.0, cost=lambda item: item)
    def echo(items: list[float]) -> list[float]:
        return items

    with pytest.raises(ValueError, match="cost"):
        await echo(-1.0)
    assert await echo(2.0) == 2.0
    assert echo.statistics().queued == 0


@pytest.mark.parametrize("units", [1e200, 1e-310])
async def test_a_cost_out_of_range_fails_that_caller_and_leaves_the_batcher_whole(units: float) -> None:
    gpu = SimulatedGPU(1 * GiB)

    @batch(probe=gpu, max_wait_s=0.0, cost=lambda item: units if item < 0 else 1.0)
    def echo(items: list[int]) -> list[int]:
        with gpu.allocate(10 * MiB * len(items)):
            time.sleep(0.02)  # the peak watch sees it
        return items

    for item in (-1, -2):
        with pytest.raises(ValueError, match=r"cost\(item\) must return a number in \[1e-09, 2\*\*40\]"):
            await echo(item)
    assert [await echo(i) for i in (1, 2, 3)] == [1, 2, 3]
    assert echo.statistics().items == 3 and echo.gate_controller().limit >= 1


async def test_a_cost_may_be_any_real_number_as_the_gate_s_cost_hook_takes() -> None:
    from fractions import Fraction

    gpu = SimulatedGPU(1 * GiB)
    told: dict[int, object] = {1: Fraction(3, 2), 2: 2, 3: "3"}  # a numpy scalar (np.prod(shape)) is a Real too

    @batch(probe=gpu, max_wait_s=0.0, cost=lambda item: told[item])
    def echo(items: list[int]) -> list[int]:
        return items

    assert [await echo(1), await echo(2)] == [1, 2]
    with pytest.raises(ValueError, match=r"cost\(item\) must return a number in .* got '3' for 3"):
        await echo(3)


async def test_with_a_cost_the_batch_is_bounded_by_units_that_fit() -> None:
    gpu = SimulatedGPU(1 * GiB)
    units_run: list[float] = []

    @batch(probe=gpu, max_wait_s=0.02, cost=lambda item: float(item))
    def pixels(items: list[int]) -> list[int]:
        units_run.append(sum(items))
        with gpu.allocate(10 * MiB * sum(items)):  # 10 MiB per unit of cost: about 97 units fit under 95%
            time.sleep(0.03)  # several readings of the peak per batch
        return [-x for x in items]

    rng = random.Random(5)
    for _ in range(6):
        items = [rng.randint(10, 40) for _ in range(24)]
        assert await gather(pixels, items) == [-x for x in items]
    stats = pixels.statistics()
    assert stats.failed_items == 0 and stats.batch_units is not None and 90 <= stats.batch_units <= 98
    assert max(units_run[-20:]) <= 98 and max(units_run) > 40  # several items per batch, within the room


def test_the_gate_controller_has_the_controller_protocol_signatures() -> None:
    from adaptive_gate._batch.gate import BatchCapacity
    from adaptive_gate.control import Controller

    for name in ("on_success", "on_oom", "on_sample", "bind"):
        wanted = inspect.signature(getattr(Controller, name))
        assert inspect.signature(getattr(BatchCapacity, name)) == wanted, name


def test_a_second_event_loop_gets_an_error_while_the_first_uses_the_line() -> None:
    started, release = threading.Event(), threading.Event()

    @batch(probe=None, max_wait_s=0.0)
    def held(items: list[int]) -> list[int]:
        started.set()
        release.wait(30)
        return items

    results: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: results.update(first=asyncio.run(held(1))))
    thread.start()
    assert started.wait(30)  # the first loop's batch runs
    try:
        with pytest.raises(RuntimeError, match="in use on another event loop"):
            asyncio.run(asyncio.wait_for(held(2), 10))
    finally:
        release.set()
        thread.join(30)
    assert results == {"first": 1}
    assert asyncio.run(held(3)) == 3  # once the line is idle, another loop may use it
