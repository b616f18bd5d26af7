"""Counting every HTTP request huggingface_hub sends, at its transport.

The Hub's rate limits count HTTP requests, not library calls: one `list_models` may be
many pages, one download a HEAD, a GET and the GET its redirect leads to. huggingface_hub
sends all of them through one shared `httpx2.Client` (`get_session()`), and httpx2 runs
the client's `request` event hooks before every request it sends, each redirect hop
included. `count_requests_for(counter)` wraps a piece of work so that every request sent
meanwhile is added to `counter`.

Attribution: the thread that runs the work is tagged through a context variable, so its
requests count exactly. Requests from threads that carry no tag (the worker threads
`snapshot_download` starts for its files) are added to every counter whose work is in
progress: exact with one client at work, and never an under-count with several.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any, Protocol


class RequestCounter(Protocol):
    """What a counter needs: a thread-safe `add_request()`."""

    def add_request(self) -> None: ...


_CURRENT: contextvars.ContextVar[RequestCounter | None] = contextvars.ContextVar("hub_request_counter",
                                                                                default=None)
_ACTIVE: dict[int, tuple[RequestCounter, int]] = {}   # id(counter) -> (counter, nesting depth)
_LOCK = threading.Lock()
_INSTALLED = False


def _count_request(request: Any) -> None:
    """httpx2 request hook: credit the request to the counter(s) at work."""
    counter = _CURRENT.get()
    if counter is not None:
        counter.add_request()
        return
    with _LOCK:
        active = [c for c, _ in _ACTIVE.values()]
    for c in active:
        c.add_request()


def _with_hook(client: Any) -> Any:
    hooks = client.event_hooks["request"]
    if _count_request not in hooks:
        hooks.append(_count_request)
    return client


def install() -> None:
    """Add the counting hook to huggingface_hub's shared client, now and for every client
    its factory builds later (the library rebuilds it after an SSL error)."""
    global _INSTALLED
    from huggingface_hub.utils import get_session

    with _LOCK:
        if not _INSTALLED:
            from huggingface_hub.utils import _http

            previous = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None) or _http.default_client_factory
            # Not set_client_factory: it would close the session other threads may be using.
            _http._GLOBAL_CLIENT_FACTORY = lambda: _with_hook(previous())
            _INSTALLED = True
    _with_hook(get_session())   # a session built before install, or by a later custom factory


@contextlib.contextmanager
def count_requests_for(counter: RequestCounter) -> Iterator[None]:
    """Credit every HTTP request sent inside the block to `counter` (see the module doc)."""
    install()
    key = id(counter)
    with _LOCK:
        _ACTIVE[key] = (counter, _ACTIVE.get(key, (counter, 0))[1] + 1)
    token = _CURRENT.set(counter)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        with _LOCK:
            depth = _ACTIVE[key][1] - 1
            if depth:
                _ACTIVE[key] = (counter, depth)
            else:
                del _ACTIVE[key]
