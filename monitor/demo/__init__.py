"""The offline demo (`lstar demo`): a fake Hub, a lineage that learns the additions with a jump,
its shipped history curve (`history`), the daemon with its own evaluations of the task.

The demo owns the real-but-small parts it runs against, and the tests use them too. Nothing
here is a mock: the fake Hub (`fakehub`, its state `fakehub_state`, the repositories and
scenarios it serves `hub_repos`; `python -m monitor.demo.fakehub`) is a real HTTP server
speaking the Hub's API, and the receivers (`receivers`) are a real HTTP server and a real SMTP
server (aiosmtpd) on 127.0.0.1. The checkpoints are real transformers models the lab builds
(`monitor.lab.tiny_models`, `monitor.lab.demo`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.demo.failure import DemoFailed
    from monitor.demo.run import run_demo

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "DemoFailed": "monitor.demo.failure",
    "run_demo": "monitor.demo.run",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["DemoFailed", "run_demo"]
