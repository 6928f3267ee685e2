"""The virtual-time driver of `adaptive_gate.simulation`: the gate's core on an event heap."""
