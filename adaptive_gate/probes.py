"""Probes: where memory readings come from (NVML, torch.cuda, both), and how a device is chosen.

A probe is any object with `sample() -> MemorySample`. The gate calls it from a worker thread, so a
probe may block, but it should be quick (NVML's memory query costs microseconds).

Device identity is the trap here. CUDA numbers devices fastest-first by default and after
`CUDA_VISIBLE_DEVICES`; NVML numbers them in PCI bus order. So a CUDA device is mapped to NVML by
UUID (or PCI bus id), never by index. And NVML counts memory that PyTorch's allocator keeps cached
but free as used: when both sources are at hand, that cache is subtracted so the gate does not
read the allocator's reserve as pressure.

`nvidia-ml-py` (module `pynvml`) and torch are imported lazily: the core needs neither.
"""

from __future__ import annotations

import logging
import os
import sys

from ._probes.nvml import NvmlProbe
from ._probes.protocol import Probe, ProbeUnavailable
from ._probes.torch_cuda import TorchCudaProbe
from .memory import MemorySample

__all__ = ["NO_DEVICE", "CombinedProbe", "NvmlProbe", "Probe", "ProbeUnavailable", "TorchCudaProbe", "auto_probe"]

logger = logging.getLogger("adaptive_gate")


class CombinedProbe:
    """NVML for the whole card, PyTorch for what its cache holds back and for swallowed OOMs."""

    def __init__(self, nvml: NvmlProbe, torch_probe: TorchCudaProbe) -> None:
        self.nvml = nvml
        self.torch = torch_probe

    def sample(self) -> MemorySample:
        used, total, _ = self.nvml.memory_info()
        allocated, reserved, ooms = self.torch.allocator_stats()
        used, total = self.torch.capped(max(0, used - (reserved - allocated)), total, allocated)
        return MemorySample(
            used_bytes=used,
            total_bytes=total,
            oom_count=self.torch.oom_count(ooms),
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            process_count=self.nvml.recent_process_count(),
        )

    @property
    def device_label(self) -> str:
        return self.nvml.uuid

    def __repr__(self) -> str:
        return f"CombinedProbe({self.nvml!r}, {self.torch!r})"


NO_DEVICE = "none"  # the metrics' device label where no probe reads a card (the status says null)


def device_label(probe: object) -> str:
    """A short, stable name for a probe's device, for metric labels: the probe's `device_label`
    (the NVML UUID for the built-in probes that have one), else its class name."""
    if probe is None:
        return NO_DEVICE
    label = getattr(probe, "device_label", None)
    return str(label) if label else type(probe).__name__


def _cuda_visible() -> list[str] | None:
    """The entries of `CUDA_VISIBLE_DEVICES` as CUDA reads them (up to the first that is no device: "-1"
    or an empty one hides the rest), or None where it is not set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    entries = []
    for entry in (part.strip() for part in visible.split(",")):
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


def auto_probe(cuda_device: int = 0, *, count_ooms: bool = True) -> tuple[Probe | None, str]:
    """Pick NVML (with torch's allocator stats where torch is loaded), else torch.cuda, else none.

    Returns the probe and one line saying what was picked and why. torch is used only when the
    application has already imported it: a probe must not load a framework into the process.
    `count_ooms` as for `TorchCudaProbe`.
    """
    torch_probe: TorchCudaProbe | None = None
    torch_why = "torch not imported by the application"
    if "torch" in sys.modules:
        try:
            torch_probe = TorchCudaProbe(cuda_device, count_ooms=count_ooms)
        except Exception as exc:
            torch_why = str(exc)
    try:
        nvml = NvmlProbe(_nvml_device_for(cuda_device, torch_probe))
    except Exception as exc:
        if torch_probe is not None:
            return torch_probe, f"probe: torch.cuda on cuda:{cuda_device} (NVML unavailable: {exc})"
        return None, f"probe: none, the gate runs on OOM and latency signals (NVML: {exc}; torch: {torch_why})"
    if torch_probe is not None:
        return CombinedProbe(nvml, torch_probe), f"probe: NVML on {nvml.name} {nvml.uuid} with torch allocator stats"
    return nvml, f"probe: NVML on {nvml.name} {nvml.uuid} ({torch_why})"


def _nvml_device_for(cuda_device: int, torch_probe: TorchCudaProbe | None) -> int | str:
    """The NVML identity of CUDA device `cuda_device`: its UUID wherever that can be known. CUDA numbers
    the devices `CUDA_VISIBLE_DEVICES` names, in its order; NVML numbers every card in PCI bus order."""
    if torch_probe is not None:
        return torch_probe.uuid()
    visible = _cuda_visible()
    if visible is None:
        return cuda_device  # CUDA's order is NVML's where CUDA_DEVICE_ORDER=PCI_BUS_ID or one card is there
    if cuda_device >= len(visible):
        raise ProbeUnavailable(
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} shows CUDA no device {cuda_device}"
        )
    entry = visible[cuda_device]
    if not entry.isdigit():
        return entry  # a UUID (GPU-... or MIG-...) names the device exactly
    # An index is NVML's only where CUDA orders by PCI bus too; otherwise say so and take the best guess.
    if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        logger.warning(
            "adaptive_gate: CUDA_VISIBLE_DEVICES=%s without CUDA_DEVICE_ORDER=PCI_BUS_ID; "
            "NVML device %s assumed (set CUDA_DEVICE_ORDER=PCI_BUS_ID or use UUIDs to be sure)",
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            entry,
        )
    return int(entry)
