"""Fail points for crash tests: `LSTAR_FAILPOINT=name[,name=value...]` in the environment.

`failpoint(name)` kills the process with SIGKILL where the code calls it, so a test can stop
a pass at an exact step and check what survives a restart; other names (`hang_<job>`,
`enospc_writes=N`, ...) are read with `failpoint_values` by the code they steer. Unset in
production, where every check is one dictionary lookup. The crash tests are described in
docs/reliability.md.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "LSTAR_FAILPOINT"


def failpoint_values() -> dict[str, str]:
    """The fail points set in `LSTAR_FAILPOINT` (`a,b=3` gives {"a": "", "b": "3"})."""
    out = {}
    for part in os.environ.get(ENV_VAR, "").split(","):
        name, _, value = part.strip().partition("=")
        if name:
            out[name] = value
    return out


def failpoint(name: str) -> None:
    """SIGKILL this process if `name` is listed in LSTAR_FAILPOINT (crash tests only)."""
    if name in failpoint_values():
        os.kill(os.getpid(), signal.SIGKILL)
