"""One reading of one device's memory: the common language of probes and controllers."""

from __future__ import annotations

from dataclasses import dataclass


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
        if self.total_bytes <= 0:
            raise ValueError(f"total_bytes must be > 0, got {self.total_bytes}")
        if self.used_bytes < 0:
            raise ValueError(f"used_bytes must be >= 0, got {self.used_bytes}")

    @property
    def utilisation(self) -> float:
        return self.used_bytes / self.total_bytes
