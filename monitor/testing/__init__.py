"""Helpers used only by the tests and benchmarks (never imported by production code).

The parts the demo also needs (fake Hub, receivers, tiny models) live in `monitor.sandbox`.
"""
