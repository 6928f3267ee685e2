"""Batching (`adaptive_gate.batch`): assembling callers into batches, the batch size policy from the
card's memory, the probe it reads, and the controller that hands a gate the batcher's capacity."""
