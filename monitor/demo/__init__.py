"""The offline demo (`lstar demo`): a fake Hub, two checkpoint families, a cloze curve, the daemon."""

from monitor.demo.run import run_demo

__all__ = ["run_demo"]
