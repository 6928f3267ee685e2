"""NVML's view of one card: every process's memory, not only this one's.

NVML numbers cards in PCI bus order, which is not CUDA's: a card is named by UUID (or PCI bus id) wherever
that can be known. `nvidia-ml-py` (module `pynvml`) is imported when a probe is made: the core needs none.
"""

from __future__ import annotations

import time
from typing import Any

from ..memory import MemorySample
from .protocol import ProbeUnavailable

__all__ = ["NvmlProbe"]

PROCESS_LIST_PERIOD_S = 5.0  # NVML's process list costs milliseconds: read it now and then


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
