"""Loading a text pool (built by `lstar corpus build-pool`): its three corpora,
each verified on load and checked against the pool manifest (and, when given, against a
committed copy of that manifest, e.g. `data/lab-pool-v1.manifest.json`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from monitor.errors import CorpusError
from monitor.scoring.corpus import MANIFEST_FILE, Corpus, load_corpus
from monitor.scoring.pool_build import SCHEMA, SPLITS

REPO_DATA = Path(__file__).resolve().parents[2] / "data"
SAMPLE_POOL = REPO_DATA / "lab-pool-sample"


def read_pool_manifest(path: str | Path) -> dict[str, Any]:
    """The `lstar-pool/1` manifest of a pool folder (or of a manifest file)."""
    path = Path(path)
    file = path / MANIFEST_FILE if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorpusError(f"{file} does not exist", hint="build the pool with `lstar corpus build-pool` "
                          "(see docs/lab.md, 'The text pool')") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorpusError(f"{file} is not a readable JSON pool manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("splits"), dict):
        raise CorpusError(f"{file} is not a {SCHEMA} pool manifest")
    for split in SPLITS:
        entry = data["splits"].get(split)
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise CorpusError(f"{file}: splits.{split}.sha256 is missing")
    return data


def load_pool_corpora(path: str | Path, *, pins: str | Path | None = None) -> tuple[Corpus, Corpus, Corpus]:
    """(train, heldout, tasks) of the pool folder `path`, every document verified.

    Each split must carry the sha256 its pool manifest records. With `pins` (a committed pool
    manifest) the pool must come from the same packages (version and sha256 of each .deb) and,
    when it is the pool the pins describe (same name and version, not a sample of it), have
    the same split pins: a pool rebuilt from other packages or by other code is refused.
    """
    folder = Path(path)
    manifest = read_pool_manifest(folder)
    if pins is not None:
        pinned = read_pool_manifest(pins)
        same_pool = (manifest.get("name"), manifest.get("version")) == (pinned.get("name"), pinned.get("version"))
        for key in ("packages", "splits") if same_pool else ("packages",):  # a sample shares the packages
            if manifest.get(key) != pinned.get(key):
                raise CorpusError(f"pool {folder}: its manifest's {key} differ from {pins}",
                                  hint="rebuild it with `lstar corpus build-pool OUT --pins "
                                       f"{pins}`")
    corpora = []
    for split in SPLITS:
        corpus = load_corpus(folder / split)
        want = manifest["splits"][split]["sha256"]
        if corpus.sha256 != want:
            raise CorpusError(f"pool {folder}: {split} has sha256 {corpus.sha256[:16]}…, the pool "
                              f"manifest says {want[:16]}…", hint="the pool's folders come from "
                              "different builds; rebuild it")
        corpora.append(corpus)
    return corpora[0], corpora[1], corpora[2]
