"""Policy files: the schema, the policy folder, loading and cross-checks (strict YAML and bounded
reads, shared with other stages, are `monitor.yamlio` and `monitor.files`)."""

from monitor.policy.files import policy_files_in, policy_fingerprint
from monitor.policy.load import PolicySet, check_policy_files, load_policies, load_policy
from monitor.policy.matchers import Matcher, matches_all, parse_matcher
from monitor.policy.schema import Policy, Report, Task, format_duration, parse_duration

__all__ = ["Matcher", "Policy", "PolicySet", "Report", "Task", "check_policy_files", "format_duration",
           "load_policies", "load_policy", "matches_all", "parse_duration",
           "parse_matcher", "policy_files_in", "policy_fingerprint"]
