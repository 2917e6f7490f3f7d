"""Benchmarks: side-by-side ratios measured in one run, written to bench/results/*.json."""
