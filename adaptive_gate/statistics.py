"""Public import path of `statistics`: the code lives in `adaptive_gate/_gate/statistics.py`."""

from ._gate.statistics import ControllerStatistics as ControllerStatistics
from ._gate.statistics import GateStatistics as GateStatistics
from ._gate.statistics import Histogram as Histogram
from ._gate.statistics import LimitChange as LimitChange
from ._gate.statistics import ProbeStatistics as ProbeStatistics

__all__ = ["ControllerStatistics", "GateStatistics", "Histogram", "LimitChange", "ProbeStatistics"]
