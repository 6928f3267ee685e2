"""`BatchProbe` behind gates, as a state machine: gates built with every kind of probe, gates gone,
batches read. At each step the batcher reads through the first live gate that reads the card, or
its own probe where none is left; a second view of the card is refused; no thread outlives it."""

from __future__ import annotations

import threading

import anyio
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from adaptive_gate import MemorySample
from adaptive_gate._batch import probe as _batch_probe
from adaptive_gate._batch.probe import BatchProbe
from adaptive_gate.probes import Probe
from adaptive_gate.testing import SimulatedGPU

GiB = 2**30
OWN = SimulatedGPU(2 * GiB, baseline_bytes=1)  # what the batcher's "auto" finds
GIVEN = SimulatedGPU(2 * GiB, baseline_bytes=2)  # a probe the batcher is given
OTHER = SimulatedGPU(2 * GiB, baseline_bytes=3)  # a gate's probe that is not the batcher's
THREADS = ("adaptive-gate-probe", "adaptive-gate-batch-peak")


class Gate:
    """A gate as the batcher sees it (`CardReader`): its probe option, and a reading of its own."""

    def __init__(self, configured: Probe | str | None, number: int) -> None:
        self.configured = configured
        self.sample = MemorySample(number * 2**20, 2 * GiB)
        self.alive = True
        self.running = True  # its sampler runs: it answers readings

    @property
    def probe(self) -> Probe | None:
        return OTHER if self.alive else None

    async def reading(self) -> MemorySample | None:
        return self.sample if self.alive and self.running else None


class BatcherBehindGates(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.threads_before = set(threading.enumerate())
        self.auto_probe = _batch_probe.auto_probe
        _batch_probe.auto_probe = lambda: (OWN, "probe: own")
        self.given: Probe | str | None = None
        self.probe: BatchProbe | None = None
        self.gates: list[Gate] = []  # those the batcher took, in order

    @rule(given=st.sampled_from(["auto", None, GIVEN]))
    def make(self, given: Probe | str | None) -> None:
        if self.probe is None:
            self.given, self.probe = given, BatchProbe(given, 0.001)

    @rule(configured=st.sampled_from(["auto", None, GIVEN, OTHER]))
    def build_a_gate(self, configured: Probe | str | None) -> None:
        if self.probe is None:
            return
        gate = Gate(configured, len(self.gates) + 10)
        two_views = not isinstance(self.given, str) and self.given is not None
        two_views = two_views and configured is not None and configured is not self.given
        try:
            self.probe.read_through(gate)
        except ValueError:
            assert two_views, "refused a gate that reads the batcher's own probe, or none"
            return
        assert not two_views, "took a gate that reads another probe than the batcher's"
        if configured is not None and self.given is not None:
            self.gates.append(gate)

    @rule(data=st.data())
    def a_gate_goes(self, data: st.DataObject) -> None:
        live = [gate for gate in self.gates if gate.alive]
        if live:
            data.draw(st.sampled_from(live)).alive = False

    @rule(data=st.data())
    def a_sampler_stops_or_starts(self, data: st.DataObject) -> None:
        if self.gates:
            gate = data.draw(st.sampled_from(self.gates))
            gate.running = not gate.running

    @rule()
    def a_batch_reads(self) -> None:
        if self.probe is None:
            return
        sample = anyio.run(self.probe.read)
        live = [gate for gate in self.gates if gate.alive]
        if live:
            answering = [gate for gate in live if gate.running]
            assert sample == (answering[0].sample if answering else None)
            assert (self.probe.watch is None) == (not answering)  # a peak watched only for a batch with a reading
        elif self.given is None:
            assert sample is None
        else:
            assert sample == (OWN if self.given == "auto" else GIVEN).sample()
        # A gone gate is noticed at the next batch (the readers are weak): from then on it says where it reads.
        assert (self.probe.description == "probe: the gate's sampler") == bool(live)
        if live:
            assert self.probe._thread._thread is None  # no probe thread of its own beside a gate's

    @invariant()
    def reads_through_the_gates_it_took_first_built_first(self) -> None:
        if self.probe is not None:
            taken = [gate for gate in self.probe.readers if isinstance(gate, Gate)]
            assert taken == [gate for gate in self.gates if gate in taken]

    def teardown(self) -> None:
        _batch_probe.auto_probe = self.auto_probe
        if self.probe is not None:
            self.probe.close()
        for thread in set(threading.enumerate()) - self.threads_before:
            if thread.name in THREADS:
                thread.join(5)
                assert not thread.is_alive(), f"{thread.name} outlived the batcher's probe"


TestBatcherBehindGates = BatcherBehindGates.TestCase
TestBatcherBehindGates.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
