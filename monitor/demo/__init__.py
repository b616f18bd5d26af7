"""The offline demo (`lstar demo`): a fake Hub, two checkpoint families, a cloze curve, the daemon."""

from monitor.demo.failure import DemoFailed
from monitor.demo.run import run_demo

__all__ = ["DemoFailed", "run_demo"]
