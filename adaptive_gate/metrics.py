"""Public import path of `metrics`: the code lives in `adaptive_gate/_observe/metrics.py`."""

from ._observe.metrics import CONTENT_TYPE as CONTENT_TYPE
from ._observe.metrics import MISSING as MISSING
from ._observe.metrics import GateMetrics as GateMetrics
from ._observe.metrics import available as available

__all__ = ["CONTENT_TYPE", "MISSING", "GateMetrics", "available"]
