"""What the gate watches and shows: the sampler that reads the probe off the event loop, the watch
on the loop's lag and the dashboard's history, the worker count, the diagnostics, and the
renderings of a snapshot (the status JSON, the Prometheus metrics)."""
