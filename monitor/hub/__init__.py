"""The Hugging Face Hub side: watch rules, the client, polling, the gate, the verified download,
the checkpoint queue's leases, and pruning the download cache."""

from monitor.hub.cache_prune import DEFAULT_KEEP_LAST, DEFAULT_MAX_BYTES, prune_cache
from monitor.hub.client import HubClient, RetryPolicy
from monitor.hub.config_budget import ConfigBudgetError, check_against_weights, config_shape
from monitor.hub.fetch import fetch_job, fetch_pinned
from monitor.hub.gate import gate_pending, resolve_cache_dir
from monitor.hub.poll import poll_once
from monitor.hub.queue import DEFAULT_LEASE_S, JobResult, Outcome, process_pending
from monitor.hub.rules import Budgets, WatchRule, load_watch_rules
from monitor.hub.safetensors_layout import LayoutError, check_file_size, read_local_header, tensor_layout

__all__ = ["Budgets", "DEFAULT_LEASE_S", "ConfigBudgetError", "DEFAULT_KEEP_LAST", "DEFAULT_MAX_BYTES", "HubClient",
           "JobResult", "LayoutError", "Outcome", "RetryPolicy", "WatchRule", "check_against_weights",
           "check_file_size", "config_shape", "fetch_job", "fetch_pinned", "gate_pending",
           "load_watch_rules", "poll_once", "process_pending", "prune_cache", "read_local_header",
           "resolve_cache_dir", "tensor_layout"]
