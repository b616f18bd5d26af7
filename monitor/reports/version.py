"""Which version of a policy a report was computed under, so two reports of "the same" policy
can be told apart: `lstar report --policy FILE` while a daemon runs gets the daemon's report of
its policy of that name, which may be another version than FILE (docs/reliability.md, row 67).

A report reads two kinds of file: the policy's text and the curve file of each task. The
version names both by content: the sha256 of the policy text as it was parsed (not as the file
reads now: a daemon keeps the version it loaded until it reloads) and the curve id of each task
(a content digest its file is checked against when loaded, or None when it did not load). The
fingerprint is the sha256 of those, so equal fingerprints mean the same inputs wherever the
files lie.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from monitor.errors import PolicyError
from monitor.policy import Policy


def policy_version(policy: Policy, curves: Mapping[str, Any]) -> dict[str, Any]:
    """The version `policy` is in, with `curves` the task curves a report loaded for it."""
    curve_ids = {task.name: getattr(curves.get(task.name), "curve_id", None) for task in policy.tasks}
    content = json.dumps({"policy_sha256": policy.source_sha256, "curves": curve_ids}, sort_keys=True)
    return {"name": policy.name, "file": str(policy.path) if policy.path is not None else None,
            "sha256": policy.source_sha256, "loaded_at": policy.loaded_at, "curves": curve_ids,
            "fingerprint": hashlib.sha256(content.encode()).hexdigest()}


def describe_version(version: Mapping[str, Any]) -> str:
    """One line: `version 1a2b3c4d5e6f (FILE sha256 ..., curves arith ...)`."""
    fingerprint = str(version.get("fingerprint") or "unknown")[:12]
    parts = [f"{version.get('file') or 'built in code'} sha256 {str(version.get('sha256') or 'unknown')[:12]}"]
    curves = version.get("curves")
    if isinstance(curves, Mapping) and curves:
        parts.append("curves " + ", ".join(f"{task} {str(cid)[:12] if cid else 'not loaded'}"
                                           for task, cid in curves.items()))
    return f"version {fingerprint} ({'; '.join(parts)})"


def require_same_version(asked: Mapping[str, Any], answered: Any) -> None:
    """Refuse a daemon's report (`answered`, its `policy_version`) computed under another
    version of the policy than the file the command was given (`asked`)."""
    answered = answered if isinstance(answered, Mapping) else {}
    if answered.get("fingerprint") == asked["fingerprint"] and asked["fingerprint"]:
        return
    name = asked["name"]
    loaded = answered.get("loaded_at")
    loaded = loaded.isoformat(timespec="seconds") if isinstance(loaded, datetime) else loaded
    theirs = (f"{describe_version(answered)}, loaded {loaded}" if answered.get("fingerprint")
              else "a version it does not name")
    raise PolicyError(
        f"the running daemon has another version of policy {name!r} in force: {theirs}; "
        f"the file read here is {describe_version(asked)}",
        hint=f"`lstar report --policy {answered.get('file') or 'FILE_IN_ITS_POLICIES_FOLDER'}` reports the daemon's "
             f"version; to report on {asked['file']}, put it in the daemon's policies folder (read within the "
             "reload interval) or stop the daemon and run the command again")


__all__ = ["describe_version", "policy_version", "require_same_version"]
