"""Helpers for the tests and benchmarks: a daemon in a subprocess, recorded scores, a report's
state, file-system faults, screenshots. They live beside the tests, outside the package, so the
wheel ships none of them; `tests/` is on the path of every test run (pyproject's `pythonpath`)
and the benchmarks that use them add it.

The parts `lstar demo` also runs (the fake Hub, the receivers) live in `monitor.demo`, the
lab's tiny models in `monitor.lab.tiny_models`.
"""
