"""The line of items waiting for a batch (`_batch/batching.py`: `Assembly`), checked against a plain list model."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from adaptive_gate._batch.batching import Assembly, Entry


class AssemblyMachine(RuleBasedStateMachine):
    """Items arrive, leave and are taken in batches; none is lost, duplicated or reordered."""

    def __init__(self) -> None:
        super().__init__()
        self.line: Assembly[int] = Assembly()
        self.model: list[Entry[int]] = []  # what should be waiting, oldest first
        self.taken: list[int] = []
        self.left: set[int] = set()
        self.next_item = 0
        self.now_s = 0.0

    @rule(units=st.floats(min_value=0.25, max_value=8.0), dt=st.floats(min_value=0.0, max_value=0.01))
    def add(self, units: float, dt: float) -> None:
        self.now_s += dt
        entry = Entry(self.next_item, units, self.now_s)
        self.next_item += 1
        self.line.add(entry)
        self.model.append(entry)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.model))
        assert self.line.remove(entry)
        assert not self.line.remove(entry)  # twice is a no-op
        self.model.remove(entry)
        self.left.add(entry.item)

    @rule(max_items=st.integers(min_value=0, max_value=6), max_units=st.floats(min_value=0.0, max_value=20.0))
    def take(self, max_items: int, max_units: float) -> None:
        batch = self.line.take(max_items, max_units)
        if self.model:
            assert batch, "a line with items must hand out at least one"
        assert batch == self.model[: len(batch)], "oldest first, in order"
        assert len(batch) <= max(1, max_items)
        if len(batch) > 1:
            assert sum(e.units for e in batch) <= max_units
        rest = self.model[len(batch) :]
        if rest and len(batch) < max(1, max_items):
            assert sum(e.units for e in batch) + rest[0].units > max_units, "stopped although the next one fit"
        for entry in batch:
            assert entry.taken and not self.line.remove(entry)
        self.taken += [e.item for e in batch]
        self.model = rest

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert len(self.line) == len(self.model)
        assert abs(self.line.units - sum(e.units for e in self.model)) < 1e-6
        assert self.line.first() is (self.model[0] if self.model else None)
        assert len(self.taken) == len(set(self.taken))
        assert not set(self.taken) & self.left

    @invariant()
    def due_when_full_or_old(self) -> None:
        if not self.model:
            assert self.line.due_s(0.01) is None
            assert not self.line.due(self.now_s, max_items=1, max_units=1.0, max_wait_s=0.0)
            return
        assert self.line.due_s(0.01) == self.model[0].arrived_s + 0.01
        assert self.line.due(self.now_s, max_items=len(self.model), max_units=1e9, max_wait_s=1e9)
        assert self.line.due(self.model[0].arrived_s + 0.5, max_items=1000, max_units=1e9, max_wait_s=0.5)
        assert not self.line.due(self.now_s, max_items=len(self.model) + 1, max_units=1e9, max_wait_s=1e9)


TestAssembly = AssemblyMachine.TestCase
TestAssembly.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@given(st.lists(st.floats(min_value=0.1, max_value=5.0), min_size=1, max_size=30), st.integers(1, 10))
def test_taking_everything_in_batches_returns_every_item_once_in_order(units: list[float], max_items: int) -> None:
    line: Assembly[int] = Assembly()
    for i, u in enumerate(units):
        line.add(Entry(i, u, 0.0))
    order: list[int] = []
    while len(line):
        order += [e.item for e in line.take(max_items, 6.0)]
    assert order == list(range(len(units)))
    assert line.units == 0.0
