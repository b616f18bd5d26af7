"""Policy files: the schema, strict YAML, bounded reads, loading and cross-checks."""

from monitor.policy.files import policy_files_in, policy_fingerprint, read_policy_bytes
from monitor.policy.load import PolicySet, check_policy_files, load_policies, load_policy
from monitor.policy.matchers import Matcher, matches_all, parse_matcher
from monitor.policy.schema import Policy, Report, Task, format_duration, parse_duration
from monitor.policy.strict_yaml import load_yaml_file

__all__ = ["Matcher", "Policy", "PolicySet", "Report", "Task", "check_policy_files", "format_duration",
           "load_policies", "load_policy", "load_yaml_file", "matches_all", "parse_duration",
           "parse_matcher", "policy_files_in", "policy_fingerprint", "read_policy_bytes"]
