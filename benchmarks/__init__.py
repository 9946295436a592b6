"""Benchmarks: one module per op, all timed by ``harness``; results go to ``benchmarks/results/``."""
