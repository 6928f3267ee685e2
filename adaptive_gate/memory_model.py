"""Public import path of `memory_model`: the code lives in `adaptive_gate/_control/memory_model.py`."""

from ._control.memory_model import BLIND_GROWTH_AFTER_SAMPLES as BLIND_GROWTH_AFTER_SAMPLES
from ._control.memory_model import MemoryEstimate as MemoryEstimate
from ._control.memory_model import MemoryModel as MemoryModel
from ._control.memory_model import OomStates as OomStates

__all__ = ["BLIND_GROWTH_AFTER_SAMPLES", "MemoryEstimate", "MemoryModel", "OomStates"]
