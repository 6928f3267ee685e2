"""`python -m benchmarks.ablation`: each rule of the default controller, on and off, everywhere.

A rule earns its place where some scenario needs it: without it, adaptive falls below the targets
(0.95 of the reader's goodput, at most the reader's OOMs plus one per change of the card) where it
met them. Every scenario of `benchmarks.virtual`, both loads, the draws of `benchmarks.unseen`
named in `UNSEEN`, the scenarios in `BEYOND`, and those in `UNOWNED` read without the process's own count, virtual
time, one seed: the full controller against the same controller with one
rule taken out, and the reader beside them.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

from adaptive_gate._control import route_weights
from adaptive_gate._control.cost_shape import CostShape
from adaptive_gate._control.oom_states import FIT_SLACK, ROOM_MARGIN, OomStates
from adaptive_gate.control import AIMD, MemoryModel

from .environment import environment
from .model import GiB, Scenario, Size
from .scenarios import SCENARIOS, middle_third
from .unseen import of_family
from .virtual import PLAN, Row, one_run, reader_run, row

RESULTS = Path(__file__).parent / "results" / "ablation.json"


def without_oom_bars() -> AIMD:
    """An OOM corrects nothing: the limit is the readings' alone."""
    controller = AIMD()
    controller.memory.ooms.record = lambda *args, **kwargs: None  # type: ignore[method-assign]
    return controller


def without_mix_tail() -> AIMD:
    """A mix is not told apart: its OOMs bar their level, as one size's do."""
    controller = AIMD()
    controller.memory.is_mix = lambda: False  # type: ignore[method-assign]
    return controller


def without_allocation_sizes() -> AIMD:
    """The allocation an OOM names is not read: no `too_large` by size, no inputs that grew."""
    controller = AIMD()
    controller.allocation_failed = lambda nbytes, units: False  # type: ignore[method-assign]
    return controller


class _NoTwofoldGrowth(AIMD):
    """The limit jumps to what the model says at once, from the first reading on."""

    def _most_after_reading(self, now_s: float, grown_from: int) -> None:
        return None


class _NoShrinkRecord(MemoryModel):
    """Keeps no record of the size from before the sizes shrank."""

    @property
    def _shrunk(self) -> None:
        return None

    @_shrunk.setter
    def _shrunk(self, value: object) -> None:
        pass


def without_old_sizes() -> AIMD:
    """Requests that joined the line before their sizes shrank weigh one slot of the new size each,
    and readings taken while one of them runs are read as any others (a line may go through them)."""
    return AIMD(memory=_NoShrinkRecord())


class _NoSlotHeldAfterOom(AIMD):
    """The slot an OOM freed goes to the line at once, not after the next reading."""

    def after_oom(self, in_flight: float) -> None:
        pass


class _NeverPressed(MemoryModel):
    def add(self, *args: Any, **kwargs: Any) -> None:
        super().add(*args, **kwargs)
        self.pressed = False


def no_slot_held_on_a_full_card() -> AIMD:
    """The others rising into a full card hold nothing back: the first slot freed is refilled."""
    return AIMD(memory=_NeverPressed())


class _RefillsOnAFullCard(AIMD):
    """After the others rose into a full card, the slots ours free are refilled, but for the one held
    back: the others may want what they free as much as the first."""

    def on_success(self, *, now_s: float, latency_s: float, concurrency: float, demand: bool) -> None:
        held = self._pressed_hold()
        super().on_success(now_s=now_s, latency_s=latency_s, concurrency=concurrency, demand=demand)
        if held is not None:
            self._until_reading = held
            self._update("memory")


class _AnyPairShrinks(MemoryModel):
    def _size_read_lately(self, floor: float) -> bool:
        return False


def any_pair_shrinks() -> AIMD:
    """Two readings in a row that say our requests hold less are a shrink, whatever the readings just
    before them showed (slots between a request's admission and its allocation read as smaller sizes)."""
    return AIMD(memory=_AnyPairShrinks())


class _QuarterSteps(MemoryModel):
    def _shrink_confirmed(self, last_step: int | None) -> bool:
        return False


def quarter_steps() -> AIMD:
    """Requests that hold less come down a quarter of the way at each pair of readings that says so,
    also at the pair right after one that did: inputs that shrank to a seventh took seconds to be believed."""
    return AIMD(memory=_QuarterSteps())


class _WholeRequestMargin(OomStates):
    def _bars(self, state: list[float], now_s: float, room: float) -> bool:  # type: ignore[override]
        need, room_then, until_s = self.ran_out(state), state[1], state[3]
        if need - FIT_SLACK <= room_then < need and now_s < until_s:  # a fit by the slack alone
            return room + FIT_SLACK < room_then + ROOM_MARGIN  # as where the model said it fitted outright
        return super()._bars(state, now_s, room)


def whole_request_margin() -> AIMD:
    """A level that ran out where the model took it for a fit within its slack comes back only once the
    card reads a whole request roomier than then, as where the model said it fitted outright."""
    controller = AIMD()
    controller.memory.ooms = _WholeRequestMargin()
    return controller


class _MeanSize(MemoryModel):
    def _share_quantile(self) -> None:
        return None


def mean_size() -> AIMD:
    """A request of one size holds the mean of what the readings showed, not at least nine tenths of
    them: readings that caught requests before their peak bring the size down."""
    return AIMD(memory=_MeanSize())


class _NamedSizeKept(MemoryModel):
    def units_changed(self) -> None:
        self._size_read = None  # nothing to come back to
        super().units_changed()


def named_size_kept() -> AIMD:
    """A size an OOM named stays when the routes get weights, as the size of the mean request (a slot)."""
    return AIMD(memory=_NamedSizeKept())


class _NoWholeSizes(MemoryModel):
    def _whole_size(self) -> None:
        return None


def no_whole_sizes() -> AIMD:
    """Readings whose requests hold whole numbers of one size, some of them none, are a spread like any
    other: a wide one makes the requests a mix of their mean."""
    return AIMD(memory=_NoWholeSizes())


class _WeightsAMix(MemoryModel):
    def told(self) -> bool:
        return False


def weights_a_mix() -> AIMD:
    """Slots that weigh what the gate was told (`cost`, route weights) are a mix like any other where their
    readings spread: requests caught before they allocate read as sizes that vary."""
    return AIMD(memory=_WeightsAMix())


class _NoUnitSeen(MemoryModel):
    def _unit_seen(self, share: float) -> None:
        return None


def no_unit_seen() -> AIMD:
    """Under a `cost`, a unit holds what nine in ten readings show, not at least the most a reading showed one
    holding: readings that catch requests before they allocate size it short."""
    return AIMD(memory=_NoUnitSeen())


class _NoNamedWhole(MemoryModel):
    def _named_whole(self, size: float) -> bool:
        return False


def no_named_whole() -> AIMD:
    """An OOM's named bytes do not end a mix whose latest readings hold whole numbers of them: readings across
    a change of sizes stay a mix, sized by their mean."""
    return AIMD(memory=_NoNamedWhole())


class _NoWholeRun(MemoryModel):
    def _whole_run(self) -> None:
        pass


def no_whole_run() -> AIMD:
    """Readings across a change of sizes stay a mix, sized by their mean, however many after it each hold a
    whole number of one size, till an OOM names that size."""
    return AIMD(memory=_NoWholeRun())


class _ShortOnlyWhileLearnt(MemoryModel):
    def _caught_short(self, floor: float) -> bool:
        return self._quantile is None and super()._caught_short(floor)


def short_only_while_learnt() -> AIMD:
    """Pairs of readings whole in the size, one short, are no shrink where the readings caught requests short
    by different numbers only till four readings have taught a size (the quantile): after that, such a pair is a
    shrink."""
    return AIMD(memory=_ShortOnlyWhileLearnt())


class _NoShrinkToANamedSize(MemoryModel):
    def _shrank_to(self, per_unit: float) -> bool:
        return False


def no_shrink_to_a_named_size() -> AIMD:
    """An OOM soon after a shrink that names less than the size from before teaches nothing till the sizes
    settle: the size stays where readings that caught requests not allocated yet put it."""
    return AIMD(memory=_NoShrinkToANamedSize())


class _ShrinkDatedByItsFirstStep(MemoryModel):
    def _none_from_before(self, in_flight: float, used: float) -> bool:
        return False


def shrink_dated_by_its_first_step() -> AIMD:
    """The time of a shrink stays when the oldest request read at its first step arrived: a request that
    joined the line before then weighs the size from before till it is served, though one of them was read
    at the new size."""
    return AIMD(memory=_ShrinkDatedByItsFirstStep())


class _NamedSizeReadAsAShrink(MemoryModel):
    def _whole_of_a_named_size(self, floor: float, readings: list[tuple[float, float]]) -> bool:
        return False


def named_size_read_as_a_shrink() -> AIMD:
    """A pair of readings that each hold a whole number of the size an OOM named lately is a shrink all the
    same, where the model holds the requests at another size (readings that catch requests not allocated yet
    read as requests that shrank)."""
    return AIMD(memory=_NamedSizeReadAsAShrink())


class _CatchesAShrink(MemoryModel):
    def _pair_share(self, pair: list[tuple[float, float, float]], floor: float) -> float:
        return math.inf


def catches_a_shrink() -> AIMD:
    """A pair of readings that says our requests hold less is a shrink where no reading just before showed them
    all at their size, though one held a request's worth more at the pair's share (requests that allocate late,
    caught with fewer of them allocated)."""
    return AIMD(memory=_CatchesAShrink())


class _OneSizeForAFewReadings(MemoryModel):
    def _one_size_for_a_window(self) -> bool:
        return False


def one_size_for_a_few_readings() -> AIMD:
    """An OOM that names another size than the readings hold whole numbers of is a mix whose sums fell whole,
    however long the readings held one size: where their shares spread, as those of requests allocating late
    do, the growth it names is never learnt."""
    return AIMD(memory=_OneSizeForAFewReadings())


class _GrowthBySpreads(MemoryModel):
    def _past_the_readings(self, per_unit: float, per_request: float) -> bool:
        return False


def growth_by_spreads() -> AIMD:
    """An OOM's named bytes are a growth of the sizes only beyond three spreads of the mean (or a mix's
    spread): the spread that the readings of a growth itself made hides it."""
    return AIMD(memory=_GrowthBySpreads())


class _HeldByTheModel(MemoryModel):
    def _held(self, used: float, own_others: float | None) -> float:
        return super()._held(used, None)  # the others' bytes the model holds, whatever the own count says


def held_by_the_model() -> AIMD:
    """A busy reading's share is the card less the others' bytes the model holds, even where the own count,
    believed, reads them otherwise."""
    return AIMD(memory=_HeldByTheModel())


class _ShrinkNeverMisread(MemoryModel):
    def _shrink_misread(self, per_unit: float, per_request: float) -> bool:
        return False


def shrink_never_misread() -> AIMD:
    """An OOM that asks for the size from before a shrink, with no request from before it in flight,
    leaves the shrink (the level is barred instead), and readings of whole requests of that size may be
    taken for another."""
    return AIMD(memory=_ShrinkNeverMisread())


class _OwnCountAgainstTheSwing(MemoryModel):
    _reading = False  # the slack changes only within `_read_busy`; `_own_told` and `_fit_recent` keep theirs

    def _read_busy(self, used: float, in_flight: float) -> None:
        self._reading = True
        try:
            super()._read_busy(used, in_flight)
        finally:
            self._reading = False

    def _own_slack(self, in_flight: float) -> float:
        return math.inf if self._reading else super()._own_slack(in_flight)


def own_count_against_the_swing() -> AIMD:
    """The others' rise the own count reads is weighed against how far the readings swing, as a rise by
    the count in flight is, not against the count's own slack."""
    return AIMD(memory=_OwnCountAgainstTheSwing())


def unowned(controller: AIMD) -> AIMD:
    """`controller` reading the card as a probe that does not tell the process's own bytes does (NVML
    alone): the others' bytes are inferred from the count in flight alone."""
    add = controller.memory.add
    controller.memory.add = lambda now_s, in_flight, used, total, own=None: add(  # type: ignore[method-assign,assignment]
        now_s, in_flight, used, total
    )
    return controller


def without_own_count() -> AIMD:
    """The process's own count of its bytes is not read."""
    return unowned(AIMD())


class _WholeSlots(AIMD):
    """Requests that weigh part of a slot fill the limit and no more: the room's part of a slot idles."""

    @property
    def budget(self) -> float:
        return float(self.limit)


VARIANTS: dict[str, Callable[[], AIMD]] = {
    "full": AIMD,
    "no OOM bars": without_oom_bars,
    "no mix tail": without_mix_tail,
    "no allocation sizes": without_allocation_sizes,
    "no twofold growth": _NoTwofoldGrowth,
    "whole slots": _WholeSlots,
    "no old sizes": without_old_sizes,
    "no own count": without_own_count,
    "no slot held after an OOM": _NoSlotHeldAfterOom,
    "whole request at a slack fit": whole_request_margin,
    "no slot held on a full card": no_slot_held_on_a_full_card,
    "refills on a full card": _RefillsOnAFullCard,
    "any pair a shrink": any_pair_shrinks,
    "a quarter a step": quarter_steps,
    "mean size": mean_size,
    "named size kept across weights": named_size_kept,
    "own count against the swing": own_count_against_the_swing,
    "no whole sizes": no_whole_sizes,
    "shrink never misread": shrink_never_misread,
    "weights a mix": weights_a_mix,
    "no unit seen": no_unit_seen,
    "no named whole size": no_named_whole,
    "no whole run": no_whole_run,
    "no shrink to a named size": no_shrink_to_a_named_size,
    "short only while learnt": short_only_while_learnt,
    "shrink dated by its first step": shrink_dated_by_its_first_step,
    "named size read as a shrink": named_size_read_as_a_shrink,
    "fewer allocated a shrink": catches_a_shrink,
    "one size for a few readings": one_size_for_a_few_readings,
    "shares by the model's others": held_by_the_model,
    "growth by spreads only": growth_by_spreads,
    "no fit of readings that stray": AIMD,  # the rule is the core's route weights': taken out by `AROUND`
    "no part per request": AIMD,  # the core's cost shape: taken out by `AROUND`
    "no line above late readings": AIMD,  # the core's route weights': taken out by `AROUND`
}
# What each rule does, by the name of the variant that takes it out (the benchmarks page's table).
RULES = {
    "no OOM bars": "an OOM bars the level it struck at while the card is no roomier",
    "no mix tail": "a mix of sizes is planned for by its tail, so its OOMs bar no level",
    "no allocation sizes": "the allocation an OOM names is the new size of inputs that grew, "
    "or `too_large` where no empty card holds it",
    "no twofold growth": "the limit grows at most twofold a reading",
    "whole slots": "the part of a slot the card has room for is filled",
    "no old sizes": "requests in line from before a shrink weigh the old size",
    "no own count": "the process's own bytes, where the probe tells them, tell ours from the others'",
    "no slot held after an OOM": "the slot an OOM frees is held till the next reading",
    "whole request at a slack fit": "a level that ran out within the slack comes back once it fits without it",
    "no slot held on a full card": "a slot is held back while the others rise into a full card",
    "refills on a full card": "then, none of the slots ours free is refilled till the next reading",
    "any pair a shrink": "a shrink is believed only where no reading just before showed the old size",
    "a quarter a step": "a shrink moves a quarter of the way at its first pair of readings, the rest at the next",
    "mean size": "requests of one size are sized by nine tenths of their readings, not their mean",
    "named size kept across weights": "a size an OOM named gives way to the readings' once routes have weights",
    "own count against the swing": "the others' rise the own count reads is weighed against the count's slack",
    "no whole sizes": "readings of whole numbers of one size, some in flight holding none, are that size caught early",
    "shrink never misread": "a shrink an OOM contradicts is undone",
    "weights a mix": "slots weighed by what the gate was told are one size a unit, however their readings spread",
    "no unit seen": "under a `cost`, a unit holds at least the most a reading showed one holding",
    "no named whole size": "an OOM's size is taken at once where a mix's latest readings hold whole numbers of it",
    "no whole run": "a mix ends once ten readings in a row hold whole numbers of one size",
    "no shrink to a named size": "soon after a shrink, an OOM that names less than the old size sets the new one",
    "short only while learnt": "a whole pair short of those in flight is a catch once four readings taught the size",
    "shrink dated by its first step": "a shrink is dated from the first request read at the new size",
    "named size read as a shrink": "a pair whole in a size an OOM named lately is requests caught before they allocate",
    "fewer allocated a shrink": "so is a pair with a request fewer allocated than the reading before",
    "one size for a few readings": "an OOM of another size after 64 whole readings is a growth, not a mix",
    "shares by the model's others": "a busy reading's share is read by the own count where it is believed",
    "growth by spreads only": "an allocation named past the window's readings is the new size "
    "where the own count agrees",
    "no fit of readings that stray": "routes told nothing are weighed by a fit of the readings less the others' bytes "
    "where no line explains them",
    "no part per request": "a `cost` holds a part per request beside its units where the readings show one",
    "no line above late readings": "where requests allocate late, routes are weighed (and a `cost` told off their "
    "bytes corrected) by the line of the readings that caught every request allocated",
}
# Draws of `benchmarks.unseen` where a rule shows its need that the plan's scenarios do not: inputs that
# shrink at the capacity, with a line of the old sizes still waiting; a neighbour that takes the room
# our requests free on a card that holds many of them, where those admitted into it fail to allocate;
# a neighbour that stays while inputs grow (their level runs out at an exact fit) and then leaves,
# a neighbour that comes to a full card, inputs that shrink to a seventh, read every quarter second, a
# neighbour that leaves room for one request, where those that failed to allocate look like requests
# that shrank, a mix of routes read every half second, whose small ones hold too little to tell whether
# the own count follows them, a mix of routes whose large one an OOM named before the weights, and two
# neighbours that wait for most of a full card (of 29 requests; of 9, read every tenth of a second),
# which take what ours free before the refills can; and a neighbour that comes to a card of four large
# requests, where one that failed to allocate beside two that hold theirs reads as a shrink by a third;
# and a mix told through a cost in a unit that makes no request a whole number, each allocating late,
# or on routes told a whole cost under the ratio of their bytes; and a mix of routes told nothing,
# each allocating late; and inputs that shrink, allocating up to twice their work late; and a neighbour
# that gives back less than a quarter of a request beside requests allocating three times their work late;
# and inputs that grow by a fifth on a card that holds many, whose readings of the change spread widely;
# and a mix told through a cost, allocating late, whose first readings alone caught every request allocated;
# and inputs that shrink by a fifth, allocating two works late, and a mix of routes allocating late, ten of
# whose readings in a row caught small ones alone allocated, after an OOM had asked for a large one's bytes;
# and a neighbour that waits for half a card of many, where some of ours admitted into its room ran out;
# and a mix of routes allocating late, whose readings hold whole numbers of the size an OOM named;
# and inputs that shrink, allocating late, whose readings read the new size short while it settled;
# and inputs that shrink from one request a card to twelve, whose line, served newest first, holds those
# that came between the change and the first request read at the new size; and requests that allocate
# late, read short while the size is learnt or after a worker's crash, where an OOM named their size;
# and requests that allocate late where a pair of readings catches fewer allocated than one before; and
# inputs that grow threefold, allocating late, whose readings held whole numbers of one size, their shares spread;
# and a large route told a whole cost under its bytes, allocating late, whose mix an OOM's named size ends; and
# requests that allocate late, caught short by different numbers after four readings taught their size; and inputs
# that shrink, allocating late, where an OOM asks for the size from before the shrink the readings passed for; and
# routes told a cost (whole or not) a third or more above their bytes' ratio, allocating late.
# Rules that live beside the controller (the core's route weights), taken out around a variant's runs.
AROUND: dict[str, Callable[[], AbstractContextManager[object]]] = {
    "no fit of readings that stray": lambda: mock.patch.object(route_weights, "NOISY_SHARE", 0.0),
    "no part per request": lambda: mock.patch.object(CostShape, "reading", lambda *args: None),
    "no line above late readings": lambda: mock.patch.object(route_weights, "_above", lambda *args: None),
}
UNSEEN: list[tuple[str, int, str]] = [
    ("neighbours", 40, "1x"),
    ("many", 49, "2x"),
    ("many", 49, "closed-32"),
    ("compound", 72, "2x"),
    ("compound", 89, "2x"),
    ("readings", 29, "2x"),
    ("readings", 39, "closed-32"),
    ("readings", 17024, "2x"),
    ("readings", 23037, "2x"),
    ("many", 81028, "2x"),
    ("readings", 81037, "closed-32"),
    ("readings", 81005, "2x"),
    ("units", 2, "2x"),
    ("whole-costs", 3, "closed-32"),
    ("whole-costs", 44, "closed-32"),
    ("late", 40, "2x"),
    ("late", 17, "closed-32"),
    ("late", 13, "closed-32"),
    ("many", 31003, "closed-32"),
    ("units", 44, "2x"),
    ("late", 90018, "2x"),
    ("late", 7053, "closed-32"),
    ("many", 90055, "2x"),
    ("late", 56, "closed-32"),
    ("late", 7059, "2x"),
    ("many", 120024, "closed-32"),
    ("late", 33, "2x"),
    ("late", 120043, "2x"),
    ("late", 50, "closed-32"),
    ("late", 7048, "2x"),
    ("late", 31, "2x"),
    ("late", 55, "closed-32"),
    ("late", 29, "closed-32"),
    ("late", 120053, "closed-32"),
    ("route-costs", 15, "closed-32"),
    ("whole-costs", 31, "closed-32"),
]
# Beyond what the families draw: a neighbour that takes nearly all the room of a 141 GiB card, where
# five requests of 2 s fit (those admitted as it comes fail to allocate, and hold nothing for 0.6 s);
# the neighbour scenario where requests allocate up to 20 ms after admission, so that readings of one
# load swing by several requests and, while the worker restarts after an OOM, those in flight hold nothing.
BEYOND: list[tuple[Scenario, str]] = [
    (
        Scenario(
            "nearly-all (141 GiB card)",
            "141 GiB card, 89.9 GiB of weights, about 5 fit, 2 s a request, OOMs do not crash",
            middle_third(Size(9546517022), 40560246209),
            total_bytes=141 * GiB,
            weights_bytes=96517575442,
            work_s=2.0,
            capacity_per_s=2.5,
        ),
        "2x",
    ),
    (
        replace(SCENARIOS["neighbour"], name="neighbour, requests allocating up to 20 ms late", start_delay_s=0.02),
        "closed-32",
    ),
]
# Scenarios run once more with a probe that does not tell the process's own bytes (NVML alone, or a
# model outside PyTorch's allocator), where the rules that read OOMs stand in for that count.
UNOWNED = ["small-neighbour", "survived-neighbour"]


def ablate(scenario: Scenario, load: str, duration_s: float, seed: int, *, own: bool = True) -> dict[str, Any]:
    reader = row("reader", reader_run(scenario, load, duration_s, seed))
    variants: dict[str, Row] = {}
    for variant, build in VARIANTS.items():
        with AROUND.get(variant, nullcontext)():
            controller = build() if own else unowned(build())
            variants[variant] = row(variant, one_run(scenario, controller, load, duration_s, seed, cost=scenario.cost))
    return {
        "scenario": scenario.name,
        "load": load,
        "reader_per_s": reader.goodput_per_s,
        "reader_ooms": reader.ooms - reader.too_large,
        "variants": {
            variant: {
                "vs_reader": round(r.goodput_per_s / reader.goodput_per_s, 3),
                "ooms": r.ooms - r.too_large,
            }
            for variant, r in variants.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ablation", description=__doc__)
    parser.add_argument("--duration", type=float, default=60.0, help="virtual seconds per run (default 60)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    table = [ablate(SCENARIOS[name], load, args.duration, args.seed) for name, loads in PLAN.items() for load in loads]
    for family, seed, load in UNSEEN:
        scenario = of_family(seed, family)
        named = replace(scenario, name=f"{scenario.name} (unseen, {family})")
        table.append(ablate(named, load, args.duration, args.seed))
    table.extend(ablate(scenario, load, args.duration, args.seed) for scenario, load in BEYOND)
    for name in UNOWNED:
        named = replace(SCENARIOS[name], name=f"{name} (no own count)")
        table.extend(ablate(named, load, args.duration, args.seed, own=False) for load in PLAN[name])
    header = "| scenario | load | " + " | ".join(VARIANTS) + " |"
    print(header)
    print("| --- | --- |" + " --- |" * len(VARIANTS))
    for entry in table:
        cells = [f"{v['vs_reader']:.2f} ({v['ooms']})" for v in entry["variants"].values()]
        print(f"| {entry['scenario']} | {entry['load']} | " + " | ".join(cells) + " |")
    command = f"python -m benchmarks.ablation --duration {args.duration:g} --seed {args.seed}"
    document = {"environment": environment(), "command": command, "duration_s": args.duration, "table": table}
    RESULTS.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
