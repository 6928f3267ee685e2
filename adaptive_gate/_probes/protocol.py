"""What a probe is: any object with `sample() -> MemorySample`, and the error that says one is not there."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..memory import MemorySample

__all__ = ["Probe", "ProbeUnavailable"]


@runtime_checkable
class Probe(Protocol):
    def sample(self) -> MemorySample: ...


class ProbeUnavailable(RuntimeError):
    """The probe's library or device is not there."""
