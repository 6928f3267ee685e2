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
import time
from typing import Any, Protocol, runtime_checkable

from .memory import MemorySample

__all__ = ["CombinedProbe", "NvmlProbe", "Probe", "TorchCudaProbe", "auto_probe"]

logger = logging.getLogger("adaptive_gate")

PROCESS_LIST_PERIOD_S = 5.0  # NVML's process list costs milliseconds: read it now and then


@runtime_checkable
class Probe(Protocol):
    def sample(self) -> MemorySample: ...


class ProbeUnavailable(RuntimeError):
    """The probe's library or device is not there."""


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise ProbeUnavailable("nvidia-ml-py is not installed (pip install 'adaptive-gate[nvml]')") from exc
    return pynvml


def _as_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether `handle` is a whole card in MIG mode (a MIG instance's own handle, or a card without MIG,
    answers no or "not supported")."""
    get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if get_mode is None:
        return False
    is_instance = getattr(nvml, "nvmlDeviceIsMigDeviceHandle", None)
    try:
        if is_instance is not None and is_instance(handle):
            return False  # an instance: whatever the mode of its card
    except Exception:
        pass
    try:
        current, _pending = get_mode(handle)
    except Exception:
        return False
    return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


class NvmlProbe:
    """Memory of one device as NVML sees it: every process's use, not only ours.

    `device` is an NVML index (PCI bus order), a UUID (`GPU-...`, `MIG-...`, or the bare hex that
    torch reports), or a PCI bus id (`00000000:01:00.0`).
    """

    def __init__(self, device: int | str = 0) -> None:
        self._pynvml = _nvml()
        try:
            self._pynvml.nvmlInit()
        except Exception as exc:
            raise ProbeUnavailable(f"NVML could not start: {exc}") from exc
        self._handle = self._find(device)
        if _mig_enabled(self._pynvml, self._handle):
            raise ProbeUnavailable(
                f"NVML device {device!r} is a card in MIG mode, whose memory is every instance's: name this "
                "process's instance (CUDA_VISIBLE_DEVICES=MIG-..., or NvmlProbe('MIG-...'))"
            )
        self.device = device
        self.name = _as_text(self._pynvml.nvmlDeviceGetName(self._handle))
        self.uuid = _as_text(self._pynvml.nvmlDeviceGetUUID(self._handle))
        self._v2 = True
        self._process_count: int | None = None
        self._process_count_read_s = -float("inf")

    def _find(self, device: int | str) -> Any:
        nvml = self._pynvml
        if isinstance(device, int):
            return nvml.nvmlDeviceGetHandleByIndex(device)
        text = device.strip()
        if text.count(":") >= 2:
            return nvml.nvmlDeviceGetHandleByPciBusId(text)
        if text.upper().startswith(("GPU-", "MIG-")):
            return nvml.nvmlDeviceGetHandleByUUID(text)
        # torch gives the bare hex of a UUID: a whole card's is GPU-..., a MIG instance's MIG-...
        try:
            return nvml.nvmlDeviceGetHandleByUUID("GPU-" + text)
        except Exception as whole_card_error:
            try:
                return nvml.nvmlDeviceGetHandleByUUID("MIG-" + text)
            except Exception:
                raise whole_card_error from None

    def memory_info(self) -> tuple[int, int, int | None]:
        """(used, total, reserved-by-driver or None): v2 where the driver has it, else v1.

        v2's `used` leaves out what the driver reserves, while `total` still includes it: the
        reserve is added back, so that `total - used` is what can still be allocated, as with v1.
        """
        nvml = self._pynvml
        if self._v2 and hasattr(nvml, "nvmlMemory_v2"):
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(self._handle, version=nvml.nvmlMemory_v2)
                return int(info.used) + int(info.reserved), int(info.total), int(info.reserved)
            except Exception:
                self._v2 = False  # an older driver: remember, and use v1 from now on
        info = nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return int(info.used), int(info.total), None

    def sample(self) -> MemorySample:
        used, total, _ = self.memory_info()
        return MemorySample(used_bytes=used, total_bytes=total, process_count=self.recent_process_count())

    def process_count(self) -> int:
        return len(self._pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle))

    def recent_process_count(self) -> int | None:
        """The process count, read at most every few seconds; None where NVML cannot list them."""
        now_s = time.monotonic()
        if now_s - self._process_count_read_s >= PROCESS_LIST_PERIOD_S:
            self._process_count_read_s = now_s
            try:
                self._process_count = self.process_count()
            except Exception:  # not supported here (some vGPU and MIG setups): no diagnosis from it
                self._process_count = None
        return self._process_count

    @property
    def device_label(self) -> str:
        return self.uuid

    def __repr__(self) -> str:
        return f"NvmlProbe({self.name!r}, uuid={self.uuid!r})"


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
