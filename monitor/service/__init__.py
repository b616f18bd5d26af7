"""The service: the daemon (`lstar run`), its local HTTP API and client, metrics, and its store."""

from monitor.service.api_guard import MAX_LIMIT
from monitor.service.client import api_get, api_post, live_daemon_url, revive_times, send_when_free
from monitor.service.daemon import DAY_S, Daemon, DaemonConfig, run_daemon
from monitor.service.state_ops import add_silence_from_args, parse_now, retry_dead_letters

__all__ = ["DAY_S", "Daemon", "DaemonConfig", "MAX_LIMIT", "add_silence_from_args", "api_get",
           "api_post", "live_daemon_url", "parse_now", "retry_dead_letters", "revive_times", "run_daemon",
           "send_when_free"]
