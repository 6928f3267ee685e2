"""The gate's loop-free core: the limiter and its line, admission and the `Retry-After` formula
(`answers.py`), tickets, counts per class, and the figures the status renders. It takes the time as
an argument; the middleware and the simulator drive it alike."""
