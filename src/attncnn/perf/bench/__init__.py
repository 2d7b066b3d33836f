"""Benchmark harness: throughput, memory and FLOP/s (see harness.py for the conventions)."""
