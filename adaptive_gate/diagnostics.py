"""Public import path of `diagnostics`: the code lives in `adaptive_gate/_observe/diagnostics.py`."""

from ._observe.diagnostics import CODES as CODES
from ._observe.diagnostics import Diagnostics as Diagnostics
from ._observe.diagnostics import Finding as Finding

__all__ = ["CODES", "Diagnostics", "Finding"]
