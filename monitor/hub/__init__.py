"""The Hugging Face Hub side: watch rules, the client, polling, the gate, the verified download,
the checkpoint queue's leases, and pruning the download cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.hub.cache_prune import DEFAULT_KEEP_LAST, DEFAULT_MAX_BYTES, prune_cache
    from monitor.hub.client import HubClient, RetryPolicy
    from monitor.hub.config_budget import ConfigBudgetError, check_against_weights, config_shape
    from monitor.hub.fetch import fetch_job, fetch_pinned
    from monitor.hub.gate import gate_pending, resolve_cache_dir
    from monitor.hub.poll import poll_once
    from monitor.hub.queue import DEFAULT_LEASE_S, JobResult, Outcome, process_pending
    from monitor.hub.rules import Budgets, WatchRule, load_watch_rules
    from monitor.hub.safetensors_layout import LayoutError, check_file_size, read_local_header, tensor_layout

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "DEFAULT_KEEP_LAST": "monitor.hub.cache_prune",
    "DEFAULT_MAX_BYTES": "monitor.hub.cache_prune",
    "prune_cache": "monitor.hub.cache_prune",
    "HubClient": "monitor.hub.client",
    "RetryPolicy": "monitor.hub.client",
    "ConfigBudgetError": "monitor.hub.config_budget",
    "check_against_weights": "monitor.hub.config_budget",
    "config_shape": "monitor.hub.config_budget",
    "fetch_job": "monitor.hub.fetch",
    "fetch_pinned": "monitor.hub.fetch",
    "gate_pending": "monitor.hub.gate",
    "resolve_cache_dir": "monitor.hub.gate",
    "poll_once": "monitor.hub.poll",
    "DEFAULT_LEASE_S": "monitor.hub.queue",
    "JobResult": "monitor.hub.queue",
    "Outcome": "monitor.hub.queue",
    "process_pending": "monitor.hub.queue",
    "Budgets": "monitor.hub.rules",
    "WatchRule": "monitor.hub.rules",
    "load_watch_rules": "monitor.hub.rules",
    "LayoutError": "monitor.hub.safetensors_layout",
    "check_file_size": "monitor.hub.safetensors_layout",
    "read_local_header": "monitor.hub.safetensors_layout",
    "tensor_layout": "monitor.hub.safetensors_layout",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["Budgets", "DEFAULT_LEASE_S", "ConfigBudgetError", "DEFAULT_KEEP_LAST", "DEFAULT_MAX_BYTES", "HubClient",
           "JobResult", "LayoutError", "Outcome", "RetryPolicy", "WatchRule", "check_against_weights",
           "check_file_size", "config_shape", "fetch_job", "fetch_pinned", "gate_pending",
           "load_watch_rules", "poll_once", "process_pending", "prune_cache", "read_local_header",
           "resolve_cache_dir", "tensor_layout"]
