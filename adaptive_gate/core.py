"""Public import path of the gate's core: the code lives in `adaptive_gate/_gate/`."""

from ._gate.core import GateCore as GateCore
from ._gate.core import InFlight as InFlight
from ._gate.core import Outcome as Outcome
from ._gate.core import Ticket as Ticket
from ._gate.core import units_of_cost as units_of_cost
from ._gate.reasons import ADMITTED as ADMITTED
from ._gate.reasons import Admitted as Admitted
from ._gate.reasons import Reason as Reason
from ._gate.reasons import Waited as Waited

__all__ = ["ADMITTED", "Admitted", "GateCore", "InFlight", "Outcome", "Reason", "Ticket", "Waited", "units_of_cost"]
