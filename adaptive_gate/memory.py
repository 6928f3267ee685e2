"""One reading of one device's memory: the common language of probes and controllers."""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import MAX_BYTES, check_bytes

__all__ = ["MAX_BYTES", "MemorySample", "check_sample"]


@dataclass(frozen=True)
class MemorySample:
    """What a probe saw on its device at one moment.

    `used_bytes` is memory that is really taken (by this process or any other); where the source
    can tell, memory cached-but-free in PyTorch's allocator is not counted, because the gate would
    otherwise read the allocator's cache as pressure. `oom_count` is a cumulative count of
    out-of-memory events where the source knows it (PyTorch's `num_ooms`), else `None`.

    The rest feed the diagnostics, where the source knows them: PyTorch's allocator totals for
    this process (`allocated_bytes` in live tensors, `reserved_bytes` held from the driver; a wide
    gap between them is fragmentation or cache), and how many processes hold memory on the device
    (`process_count`, from NVML's process list).
    """

    used_bytes: int
    total_bytes: int
    oom_count: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    process_count: int | None = None

    def __post_init__(self) -> None:
        # A probe is code we do not control: a reading it makes up (NaN, negative, more used than
        # the card has, a count that is not a count) must fail here, where the sampler counts it as
        # a probe error, and never reach the arithmetic of the controller or the status.
        for name in ("used_bytes", "total_bytes"):
            object.__setattr__(self, name, check_bytes(name, getattr(self, name)))
        for name in ("oom_count", "allocated_bytes", "reserved_bytes", "process_count"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_bytes(name, value))
        if self.total_bytes <= 0:
            raise ValueError(f"total_bytes must be > 0, got {self.total_bytes}")
        if self.used_bytes > self.total_bytes:
            raise ValueError(f"used_bytes ({self.used_bytes}) must not exceed total_bytes ({self.total_bytes})")

    @property
    def utilisation(self) -> float:
        return self.used_bytes / self.total_bytes


def check_sample(sample: object) -> MemorySample:
    """The reading as the gate may use it, or TypeError/ValueError saying what is wrong with it.

    Construction checks a `MemorySample` already; this checks again for what a probe hands over,
    which need not have been constructed (a subclass, a copy with its fields replaced in place).
    """
    if not isinstance(sample, MemorySample):
        raise TypeError(f"probe.sample() returned {type(sample).__name__}, not a MemorySample")
    MemorySample.__post_init__(sample)
    return sample
