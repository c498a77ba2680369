"""Performance benchmarks (`python -m benchmarks.<name>`): side-by-side ratios, never test assertions."""
