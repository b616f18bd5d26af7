"""Shared fixtures: the ../shared data folder, and a hardened environment for transformers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = (REPO_ROOT.parent / "shared").resolve()

# Must be set before transformers / huggingface_hub are imported anywhere in the session.
os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The workers each run torch on its own threads, and many tests start subprocesses that do too,
# so the cores are oversubscribed: OpenMP threads that spin while they wait then burn the CPU
# another worker needs (a small-model forward loop under load: 10 CPU-s passive, 13-14
# spinning, docs/testing.md). Waiting passively changes no number, only who gets the core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The tests talk only to Hubs they start on 127.0.0.1; an air-gapped user's offline switch would
# refuse those requests (and `lstar run`/`poll` refuse to start under it). Tests of that
# behaviour set the variables themselves, in the subprocesses they start.
for _offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.pop(_offline, None)

# The suite starts hundreds of Python processes (daemons, scoring children, `lstar` commands)
# that import the package. Where PYTHONDONTWRITEBYTECODE is set (container images often set it)
# nothing is ever cached, and each of them compiles every package module it imports from source
# again: 0.2 CPU-seconds for the daemon's modules alone. The suite writes bytecode (into the
# checkout's __pycache__ folders, which git ignores) for its own processes, which inherit this
# environment; pytest's rewritten test modules are cached the same way.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared data folder (corpus, tokenizers, tasks) beside the checkout."""
    if not (SHARED_DIR / "corpus" / "calib-v0" / "manifest.json").exists():
        pytest.fail(f"shared data not found at {SHARED_DIR}: the tests need ../shared beside the checkout")
    return SHARED_DIR


@pytest.fixture(scope="session")
def calib_v0(shared_dir: Path) -> Path:
    """Path of the pinned calibration corpus calib-v0."""
    return shared_dir / "corpus" / "calib-v0"


@pytest.hookimpl(optionalhook=True)      # an xdist hook: pytest without xdist must not refuse it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker more than the cores (tests/support/file_costs.py says why), unless
    PYTEST_XDIST_AUTO_NUM_WORKERS names a number, which xdist then takes as it documents."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from support.file_costs import suite_workers

    return suite_workers()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The costliest test files first (tests/file_costs.json), so that with `--dist loadfile
    --no-loadscope-reorder` the long files start at once and the workers end together."""
    from support.file_costs import costliest_first, load_costs

    items[:] = costliest_first(items, load_costs())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With TEST_COSTS_DIR=DIR, each test's CPU-seconds and wall time go to DIR (docs/testing.md)."""
    from support.file_costs import COSTS_ENV, recorded

    with recorded(item.nodeid, os.environ.get(COSTS_ENV)):
        return (yield)


@pytest.fixture(scope="session")
def _store_template(tmp_path_factory: pytest.TempPathFactory):
    from support.store_template import StoreTemplate

    return StoreTemplate(tmp_path_factory.mktemp("store-template"))


@pytest.fixture(scope="module", autouse=True)
def _migrated_store_from_template(request: pytest.FixtureRequest, _store_template):
    """A test's first open of a new state file starts from a copy of one migrated file instead of
    running every migration again (tests/support/store_template.py says when, and what still runs)."""
    from support.store_template import FRESH_MIGRATION_MODULES, use_template

    if request.module.__name__ in FRESH_MIGRATION_MODULES:
        yield None
        return
    with use_template(_store_template) as template:
        yield template
