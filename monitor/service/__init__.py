"""The service: the daemon (`lstar run`), its local HTTP API and client, metrics, and its store."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.service.client import api_get, api_post, live_daemon_url, revive_times, send_when_free
    from monitor.constants import DAY_S
    from monitor.service.daemon import Daemon, DaemonConfig, run_daemon

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "api_get": "monitor.service.client",
    "api_post": "monitor.service.client",
    "live_daemon_url": "monitor.service.client",
    "revive_times": "monitor.service.client",
    "send_when_free": "monitor.service.client",
    "DAY_S": "monitor.constants",
    "Daemon": "monitor.service.daemon",
    "DaemonConfig": "monitor.service.daemon",
    "run_daemon": "monitor.service.daemon",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["DAY_S", "Daemon", "DaemonConfig", "api_get", "api_post", "live_daemon_url", "revive_times",
           "run_daemon", "send_when_free"]
