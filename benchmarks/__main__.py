"""List the benchmarks: `python -m benchmarks.quatro_solver`, `python -m benchmarks.similarity`."""
print(__doc__)
