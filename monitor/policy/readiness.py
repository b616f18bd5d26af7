"""Whether the policies in force can do their job: checked at the daemon's start and on every
reload tick, told in its log and by `/health`.

A missing policy folder is an error at start (`require_policy_folder`): nothing could ever
be watched. A folder with no policy that loads, and a receiver whose secret cannot be
resolved, are fixable while the daemon runs (a file edited and reloaded, a secret file
written), so the daemon starts but is not healthy (`policy_problems`) until they are fixed;
a run with `--once` exits non-zero.
"""

from __future__ import annotations

from pathlib import Path

from monitor.errors import PolicyError
from monitor.policy.load import PolicySet
from monitor.policy.secrets import missing_secrets


def require_policy_folder(folder: Path) -> None:
    """Raise a one-line PolicyError unless `folder` is a folder (`lstar run --policies`)."""
    if folder.is_dir():
        return
    what = "is not a folder" if folder.exists() else "does not exist"
    raise PolicyError(f"--policies {folder}: {what}",
                      hint="create it, or point --policies at the folder of policy files (*.yaml)")


def policy_problems(folder: Path, policies: PolicySet) -> list[str]:
    """Why the policies in force cannot alert as written, one line each (none: ready).

    `no policy in force: ...` when no file of `folder` is in force, and one
    `receiver secret missing: FILE: receiver 'NAME': KEY: reason` per secret a receiver of a
    policy in force names that cannot be resolved now. Secret values are never included.
    """
    in_force = policies.current()
    if not in_force:
        if not folder.is_dir():
            why = f"the policy folder {folder} is missing"
        elif not policies.paths:
            why = f"no policy files (*.yaml, *.yml) in {folder}"
        else:
            failed = ", ".join(p.name for p in policies.paths)
            why = (f"no file of {folder} loads ({failed}); see policy_errors in /status or run "
                   f"`lstar policy check {folder}`")
        return [f"no policy in force: {why}"]
    return [f"receiver secret missing: {missing.line()}" for policy in in_force
            for missing in missing_secrets(policy)]


__all__ = ["policy_problems", "require_policy_folder"]
