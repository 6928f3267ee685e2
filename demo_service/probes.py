"""A probe for a card that plays a smaller one (`--vram-fraction`).

`set_per_process_memory_fraction` caps PyTorch alone; NVML still reports the whole card, so the
gate would see room that PyTorch will refuse. This probe reports the fraction as the card, and
PyTorch's allocated bytes as used (its cache is given back before it refuses an allocation). It
reports no OOM count: the demo's routes catch no OOM, so the allocator's `num_ooms` would add only
the OOMs cuDNN catches itself while it looks for a convolution workspace that fits.
"""

from __future__ import annotations

from adaptive_gate import MemorySample
from adaptive_gate.probes import TorchCudaProbe


class FractionProbe:
    def __init__(self, device: int, fraction: float) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"--vram-fraction must be in (0, 1], got {fraction}")
        self._torch = TorchCudaProbe(device, count_ooms=False)
        self.fraction = fraction

    def sample(self) -> MemorySample:
        whole = self._torch.sample()
        allocated, _, _ = self._torch.allocator_stats()
        return MemorySample(allocated, int(whole.total_bytes * self.fraction))

    def __repr__(self) -> str:
        return f"FractionProbe(cuda:{self._torch.device}, fraction={self.fraction})"
