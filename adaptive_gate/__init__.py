"""adaptive-gate: VRAM-aware admission control for FastAPI/Starlette services that run GPU inference."""

from ._control.control import AIMD, Controller, Fixed
from ._gate.limiter import Limiter, QueueFull, QueueTimeout
from ._version import __version__
from .batch import Batched, BatchStatistics, batch
from .memory import MemorySample
from .middleware import AdaptiveGate
from .oom import is_oom
from .probes import CombinedProbe, NvmlProbe, Probe, TorchCudaProbe

__all__ = [
    "AIMD",
    "AdaptiveGate",
    "BatchStatistics",
    "Batched",
    "CombinedProbe",
    "Controller",
    "Fixed",
    "Limiter",
    "MemorySample",
    "NvmlProbe",
    "Probe",
    "QueueFull",
    "QueueTimeout",
    "TorchCudaProbe",
    "__version__",
    "batch",
    "is_oom",
]
