"""The GPU run: benchmarks/gpu/run.sh and the Python steps and wheel set it drives."""
