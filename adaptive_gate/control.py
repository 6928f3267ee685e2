"""Public import path of `control`: the code lives in `adaptive_gate/_control/control.py`."""

from ._control.control import AIMD as AIMD
from ._control.control import Controller as Controller
from ._control.control import Fixed as Fixed
from ._control.control import MemoryModel as MemoryModel

__all__ = ["AIMD", "Controller", "Fixed", "MemoryModel"]
