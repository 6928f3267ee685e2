"""Public import path of `limiter`: the code lives in `adaptive_gate/_gate/limiter.py`."""

from ._gate.limiter import Limiter as Limiter
from ._gate.limiter import LimiterStatistics as LimiterStatistics
from ._gate.limiter import QueueFull as QueueFull
from ._gate.limiter import QueueTimeout as QueueTimeout
from ._gate.limiter import Waiter as Waiter

__all__ = ["Limiter", "LimiterStatistics", "QueueFull", "QueueTimeout", "Waiter"]
