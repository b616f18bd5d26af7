"""Policy files: the schema, the policy folder, loading and cross-checks (strict YAML and bounded
reads, shared with other stages, are `monitor.yamlio` and `monitor.files`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.policy.files import policy_files_in, policy_fingerprint
    from monitor.policy.load import PolicySet, check_policy_files, load_policies, load_policy
    from monitor.policy.matchers import Matcher, matches_all, parse_matcher
    from monitor.policy.schema import Policy, Report, Task, format_duration, parse_duration

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "policy_files_in": "monitor.policy.files",
    "policy_fingerprint": "monitor.policy.files",
    "PolicySet": "monitor.policy.load",
    "check_policy_files": "monitor.policy.load",
    "load_policies": "monitor.policy.load",
    "load_policy": "monitor.policy.load",
    "Matcher": "monitor.policy.matchers",
    "matches_all": "monitor.policy.matchers",
    "parse_matcher": "monitor.policy.matchers",
    "Policy": "monitor.policy.schema",
    "Report": "monitor.policy.schema",
    "Task": "monitor.policy.schema",
    "format_duration": "monitor.policy.schema",
    "parse_duration": "monitor.policy.schema",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["Matcher", "Policy", "PolicySet", "Report", "Task", "check_policy_files", "format_duration",
           "load_policies", "load_policy", "matches_all", "parse_duration",
           "parse_matcher", "policy_files_in", "policy_fingerprint"]
