"""The service: the daemon (`lstar run`), its local HTTP API and client, metrics, and its store."""

from monitor.service.client import api_get, api_post, live_daemon_url, revive_times, send_when_free
from monitor.service.daemon import DAY_S, Daemon, DaemonConfig, run_daemon

__all__ = ["DAY_S", "Daemon", "DaemonConfig", "api_get", "api_post", "live_daemon_url", "revive_times",
           "run_daemon", "send_when_free"]
