"""A model card's YAML front matter (`README.md` between `---` lines), read the way the Hub reads
it into `cardData`: what a checkpoint folder or a Hub commit says about its base model.

The card is the repo owner's text: at most CARD_MAX_BYTES are read, and the front matter goes
through the package's one bounded YAML loader (`monitor.yamlio`: no tags, no alias bombs, no
deep nesting). A card that cannot be read as a mapping gives no metadata and says why, never
an exception.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from monitor.errors import PolicyError
from monitor.files import FileKind
from monitor.yamlio import compose, construct

CARD_FILE = "README.md"
CARD_MAX_BYTES = 64 << 10
MODEL_CARD = FileKind("model card", "model cards", "YAML front matter")


def card_front_matter(raw: bytes, label: str = CARD_FILE) -> tuple[dict[str, Any] | None, str | None]:
    """(the front matter as JSON-like data, None), or (None, why there is none).

    Only the first CARD_MAX_BYTES count; a card with no front matter gives (None, None)."""
    if not raw.startswith(b"---"):
        return None, None
    text = raw[:CARD_MAX_BYTES].decode("utf-8", errors="replace")
    end = text.find("\n---", 3)
    if end < 0:
        return None, f"{label}: the front matter has no closing `---` in its first {CARD_MAX_BYTES:,} bytes"
    try:
        root = compose(text[3:end], label, what=MODEL_CARD)
        data = construct(root, label) if root is not None else None
        # As the Hub answers it: JSON, any scalar that is not JSON becoming its text.
        data = json.loads(json.dumps(data, default=str))
    except (PolicyError, ValueError) as exc:
        return None, f"{label}: front matter not read: {getattr(exc, 'message', exc)}"
    if data is None:
        return None, None
    if not isinstance(data, dict):
        return None, f"{label}: the front matter is a {type(data).__name__}, not a mapping"
    return data, None


def read_folder_card(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The front matter of `folder/README.md` (bounded read), or (None, why) as `card_front_matter`."""
    path = folder / CARD_FILE
    if not path.is_file():
        return None, None
    try:
        with path.open("rb") as handle:
            raw = handle.read(CARD_MAX_BYTES)
    except OSError as exc:
        return None, f"{path}: cannot be read: {exc.strerror or exc}"
    return card_front_matter(raw, str(path))
