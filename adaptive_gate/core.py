"""Public import path of `core`: the code lives in `adaptive_gate/_gate/core.py`."""

from ._gate.core import ADMITTED as ADMITTED
from ._gate.core import GateCore as GateCore
from ._gate.core import InFlight as InFlight
from ._gate.core import Outcome as Outcome
from ._gate.core import Ticket as Ticket
from ._gate.core import units_of_cost as units_of_cost

__all__ = ["ADMITTED", "GateCore", "InFlight", "Outcome", "Ticket", "units_of_cost"]
