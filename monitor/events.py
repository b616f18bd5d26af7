"""The event log: one line per thing the watcher did, with the ids that name it.

`event("discovered", checkpoint=7, repo="org/name", commit="abc…", rule="tiny")` logs,
under the `lstar.events` logger at INFO, the line `discovered checkpoint=7 repo=org/name
commit=abc… rule=tiny`; with `--log-format json` (`JsonFormatter`) every log record, events
and the rest, is one JSON object per line, an event's fields as keys of their own.

Kinds: discovered, gated, refused, scored, score_failed, state, evaluation_skipped,
alert_raised, delivered, retried, dead_lettered, report_written, silence_unreadable. Values are ids, states,
numbers and reasons: never secrets, URLs with credentials or notification bodies.

Listeners (`subscribe`) see every event whatever the log level; the daemon counts them
for the `--once` summary.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

log = logging.getLogger("lstar.events")
EVENT_KINDS = ("discovered", "gated", "refused", "scored", "score_failed", "state", "evaluation_skipped",
               "reference_base", "alert_raised", "delivered", "retried", "dead_lettered", "report_written",
               "silence_unreadable")

Listener = Callable[[str, Mapping[str, Any]], None]
_listeners: list[Listener] = []
_listeners_lock = threading.Lock()


def _plain(value: Any) -> Any:
    """A JSON-safe form of one field (datetimes as ISO text, non-finite floats as null)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _text(value: Any) -> str:
    """One field in the human line: quoted (as a JSON string, every control and non-ASCII
    character escaped) when it holds a space, an equals sign, a quote, a backslash or any
    character that is not printable: an ESC, a carriage return or a bidirectional override
    from a Hub name must not reach the terminal raw."""
    value = _plain(value)
    text = "-" if value is None else str(value)
    if not text or any(c in ' ="\\' or not c.isprintable() for c in text):
        return json.dumps(text)
    return text


def event(kind: str, /, **fields: Any) -> None:
    """Log one event of `kind` with its ids and values (None values are left out)."""
    data = {k: _plain(v) for k, v in fields.items() if v is not None}
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(kind, data)
        except Exception:  # noqa: BLE001 - a listener must never break the work it watches
            log.exception("event listener failed on %s", kind)
    if log.isEnabledFor(logging.INFO):
        line = " ".join([kind, *(f"{k}={_text(v)}" for k, v in data.items())])
        log.info("%s", line, extra={"lstar_event": kind, "lstar_fields": data})


def subscribe(listener: Listener) -> Callable[[], None]:
    """Call `listener(kind, fields)` on every event; returns the function that stops it."""
    with _listeners_lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _listeners_lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message; an event's kind and fields
    as keys of their own; a traceback as `exc`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name}
        kind = getattr(record, "lstar_event", None)
        if kind is not None:
            out["event"] = kind
            for key, value in getattr(record, "lstar_fields", {}).items():
                out.setdefault(key, value)
        out["message"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


LOG_FORMATS = ("text", "json")


def configure_logging(fmt: str = "text") -> None:
    """Set up the root logger for the daemon: human lines (`text`) or JSON lines (`json`) on
    stderr, at INFO; an existing configuration is left alone for `text`."""
    root = logging.getLogger()
    if fmt == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        logging.captureWarnings(True)   # a library's warning is a JSON line too, not raw text
    elif not root.handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Events are the log's point: shown even where the root logger is set quieter.
    log.setLevel(logging.INFO)


__all__ = ["event", "subscribe", "JsonFormatter", "configure_logging", "EVENT_KINDS", "LOG_FORMATS"]
