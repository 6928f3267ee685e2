"""PyTorch's view of one card: free and total memory, and its allocator's stats (`num_ooms` among them).

torch is imported when a probe is made, and only where the application has imported it already.
"""

from __future__ import annotations

from ..memory import MemorySample
from .protocol import ProbeUnavailable

__all__ = ["TorchCudaProbe"]


class TorchCudaProbe:
    """Memory as this process's PyTorch sees it: free/total on the card, and its allocator's stats.

    The allocator's `num_ooms` is how OOMs that the application swallowed still reach the gate.
    But it also counts the OOMs that libraries catch themselves and recover from: cuDNN, looking for
    a convolution workspace that fits, tries the large ones first and catches the OOMs, so a
    convolutional model near its limit raises `num_ooms` on requests that succeed. An application
    whose routes never catch an OOM (every one reaches the gate as an error) passes
    `count_ooms=False`, and the samples carry no `oom_count`.
    """

    def __init__(self, device: int = 0, *, count_ooms: bool = True) -> None:
        try:
            import torch
        except ImportError as exc:
            raise ProbeUnavailable("torch is not installed") from exc
        if not torch.cuda.is_available():
            raise ProbeUnavailable("torch.cuda.is_available() is False")
        self._torch = torch
        self.device = device
        self.count_ooms = count_ooms
        self._context_seen = False  # whether the process was seen to have a CUDA context on the device

    def oom_count(self, ooms: int) -> int | None:
        """The count a sample reports: the allocator's, or None where it is not to be counted."""
        return ooms if self.count_ooms else None

    def allocator_stats(self) -> tuple[int, int, int]:
        """(allocated, reserved, num_ooms). Reading the stats creates no CUDA context."""
        stats = self._torch.cuda.memory_stats(self.device)
        return (
            int(stats.get("allocated_bytes.all.current", 0)),
            int(stats.get("reserved_bytes.all.current", 0)),
            int(stats.get("num_ooms", 0)),
        )

    def uuid(self) -> str:
        return str(self._torch.cuda.get_device_properties(self.device).uuid)

    def _has_context(self, reserved: int) -> bool:
        """Whether this process has a CUDA context on the device, asked without making one: torch's CUDA
        builds answer it (a context another framework made counts), else memory the allocator holds there."""
        has_primary = getattr(self._torch._C, "_cuda_hasPrimaryContext", None)
        if has_primary is not None:
            try:
                return bool(has_primary(self.device))
            except Exception:  # a private function: asked where it is, and not relied on
                pass
        return reserved > 0

    def capped(self, used: int, total: int, allocated: int) -> tuple[int, int]:
        """(used, total) of a reading of the whole card, within what this process's allocator may hold
        where the app capped it (`torch.cuda.set_per_process_memory_fraction`: NVML and `mem_get_info`
        still show the whole card, and PyTorch refuses past the cap). `used` leaves out the allocator's
        cache, which it gives back before it refuses."""
        cuda = self._torch.cuda
        fraction_of = getattr(cuda, "get_per_process_memory_fraction", None)  # torch 2.6 and later
        if fraction_of is None or not cuda.is_initialized():
            return used, total  # setting a fraction initialises CUDA: none was set
        fraction = float(fraction_of(self.device))
        if not 0.0 < fraction < 1.0:
            return used, total
        cap = int(total * fraction)
        # Room: under the cap beside what the allocator holds, and on the card beside everything.
        room = max(0, min(cap - allocated, total - used))
        return cap - room, cap

    def sample(self) -> MemorySample:
        allocated, reserved, ooms = self.allocator_stats()
        if not self._context_seen:
            # `mem_get_info` creates a CUDA context (hundreds of MiB) on a device that has none: not ours to
            # create, from the probe's thread, on a card the app may not even use.
            if not self._has_context(reserved):
                raise ProbeUnavailable(
                    f"no CUDA context of this process on cuda:{self.device} yet: not read until the app makes one "
                    "(reading free memory would create it)"
                )
            self._context_seen = True
        free, total = self._torch.cuda.mem_get_info(self.device)
        used, total = self.capped(max(0, int(total - free) - (reserved - allocated)), int(total), allocated)
        return MemorySample(
            used_bytes=used,
            total_bytes=total,
            oom_count=self.oom_count(ooms),
            allocated_bytes=allocated,
            reserved_bytes=reserved,
        )

    @property
    def device_label(self) -> str:
        return f"cuda:{self.device}"

    def __repr__(self) -> str:
        return f"TorchCudaProbe(cuda:{self.device})"
