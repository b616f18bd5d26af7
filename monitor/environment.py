"""Process settings that must hold before transformers or huggingface_hub are imported.

Set here and only here; `lstar`, the scoring child and the loader call these.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit


def disable_safetensors_conversion() -> None:
    """Keep transformers from sending a repo (and its token) to the external safetensors
    conversion service and loading weights from the bot's PR ref (docs/reliability.md)."""
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"


def harden_environment() -> None:
    """The settings every process that may touch the Hub or a model runs with."""
    disable_safetensors_conversion()
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def quiet_hub_progress() -> None:
    """No huggingface_hub progress bars ("Fetching 1 files") in the daemon's output: it runs
    unattended, its log is read line by line, and download sizes are checked elsewhere (the
    byte caps count what arrives whether or not a bar is drawn)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:  # imported already: the variable was read at import
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


# huggingface_hub's offline switch: HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE, read at its import.
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = ("1", "ON", "YES", "TRUE")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def hub_offline_variable() -> str | None:
    """The variable that puts huggingface_hub in offline mode in this environment, or None.

    Read as huggingface_hub reads it (`HF_HUB_OFFLINE`, or `TRANSFORMERS_OFFLINE` when the first
    is unset or empty; 1/ON/YES/TRUE in any case mean offline), from the environment as it is
    now rather than from the value huggingface_hub took at its import."""
    for name in OFFLINE_VARIABLES:
        value = os.environ.get(name)
        if value:
            return name if value.strip().upper() in _TRUE else None
    return None


def refuse_hub_offline(command: str) -> None:
    """Stop a command that must reach the Hub when offline mode is set: every request it made
    would fail with OfflineModeIsEnabled, poll after poll, with nothing found."""
    from monitor.errors import LstarError

    name = hub_offline_variable()
    if name is not None:
        raise LstarError(f"{command} cannot poll the Hub while {name}={os.environ[name]} is set "
                         "(huggingface_hub refuses every request in offline mode)",
                         hint=f"unset {name} for the watcher; `lstar demo` runs with it set")


@contextlib.contextmanager
def local_hub_online(endpoint: str) -> Iterator[None]:
    """huggingface_hub's offline mode lifted in this process while the block runs, for a Hub on
    this machine (the demo's fake Hub on 127.0.0.1 is not the public Hub).

    Only this process's setting changes: the environment, and with it every child process
    (the scoring child loads local files only), keeps offline mode. Refuses any endpoint that
    is not a loopback address."""
    host = urlsplit(endpoint).hostname
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"offline mode is lifted only for a Hub on this machine, not {endpoint!r}")
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def is_loopback_endpoint(endpoint: str | None) -> bool:
    """Whether `endpoint` names a Hub on this machine (127.0.0.1, localhost, ::1)."""
    try:
        return bool(endpoint) and urlsplit(endpoint).hostname in LOOPBACK_HOSTS
    except ValueError:   # a malformed HF_ENDPOINT (`http://[::1`) names no host, loopback or not
        return False


@contextlib.contextmanager
def hub_reachable(command: str, endpoint: str | None, *, verb: str = "fetch from") -> Iterator[None]:
    """Run a command that fetches from the Hub whatever the offline switch says about a Hub on
    this machine, and stop it in one line before anything is loaded when the switch would make
    every request to another Hub fail.

    `endpoint` is the command's --endpoint (None: HF_ENDPOINT). A loopback Hub (the guide's and
    the demo's fake Hub) is reached with offline mode lifted in this process only, as the demo
    does (child processes keep it: the scoring child loads fetched files only); any other Hub
    with offline mode set is refused, `{command} cannot {verb} the Hub while ...` (resolving a
    revision or listing a repo is always a request, so offline mode could never succeed there)."""
    name = hub_offline_variable()
    if name is None:
        yield
        return
    target = endpoint or os.environ.get("HF_ENDPOINT") or None
    if is_loopback_endpoint(target):
        with local_hub_online(target):  # type: ignore[arg-type]
            yield
        return
    from monitor.errors import LstarError

    raise LstarError(f"{command} cannot {verb} the Hub while {name}={os.environ[name]} is set "
                     "(huggingface_hub refuses every request in offline mode)",
                     hint=f"unset {name}, or point HF_ENDPOINT at a Hub on this machine (127.0.0.1)")
