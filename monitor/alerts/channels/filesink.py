"""File channel: one JSON line per notification, appended and fsynced (an audit trail).

A crash between the write and the outbox update can append the same notification twice;
the `id` field (the same as the webhook-id) tells the copies apart.
"""

from __future__ import annotations

import errno
import json
import os
from datetime import datetime
from typing import Any

from monitor.alerts.channels.base import Outgoing, SendResult
from monitor.alerts.payload import rfc3339

# Errors an operator must fix (EEXIST: a file sits where the folder should be); anything
# else (disk full, I/O error) is retried.
PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EISDIR, errno.EROFS, errno.ENOTDIR,
                              errno.EEXIST})


class FileSender:
    """Appends to `receiver.file.path` (relative to the policy file)."""

    def send(self, message: Outgoing, receiver: Any, policy: Any, *, now: datetime) -> SendResult:
        path = policy.resolve_path(receiver.file.path)
        line = json.dumps({"id": message.id, "sent_at": rfc3339(now), "policy": message.policy,
                           "receiver": message.receiver, "message": message.body},
                          sort_keys=True, ensure_ascii=False)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            outcome = "dead" if exc.errno in PERMANENT_ERRNOS else "retry"
            return SendResult(outcome, None, f"cannot append to {path}: {exc.strerror}")
        return SendResult("delivered")
