"""What a non-editable install ships, and that production code imports only what it declares.

A green run on a developer's machine once hid an undeclared dependency; these checks read the
package as it is installed from its wheel, and the imports as the source states them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from import_graph import imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "monitor"
TEST_ONLY = PACKAGE / "testing"
# Offline stand-ins the demo uses; they may need the test extras (aiosmtpd for the SMTP receiver).
SANDBOX = PACKAGE / "sandbox"
# Modules that exist to use an optional extra, imported only when that feature is asked for.
EXTRA_MODULES = {PACKAGE / "scoring" / "backends" / "ray.py": "ray",
                 PACKAGE / "calibrate" / "evaluate.py": "bench"}


def _production_modules() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if TEST_ONLY not in p.parents]


def _requirement_names(extra: str | None) -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    import tomllib

    project = tomllib.loads(text)["project"]
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def test_every_third_party_import_is_declared() -> None:
    stdlib = set(sys.stdlib_module_names)
    dists = importlib.metadata.packages_distributions()
    core = _requirement_names(None)
    test_extra = core | _requirement_names("test")
    missing = []
    for path in _production_modules():
        allowed = test_extra if SANDBOX in path.parents else core
        if path in EXTRA_MODULES:
            allowed = core | _requirement_names(EXTRA_MODULES[path])
        for imp in imports(path):
            line, top = imp.line, imp.module.split(".")[0]
            if top in stdlib or top in ("monitor", "__future__"):
                continue
            # An optional extra that is not installed here (lm_eval of `bench`) has no owning
            # distribution: its import name, normalised, is what the extra must declare.
            owners = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
            if not owners & allowed:
                missing.append(f"{path.relative_to(ROOT)}:{line} imports {top} "
                               f"(from {sorted(owners) or 'no installed distribution'})")
    assert not missing, "declare these in pyproject.toml:\n" + "\n".join(missing)


def test_duckdb_timestamptz_needs_its_declared_helper() -> None:
    """DuckDB returns TIMESTAMPTZ values through pytz: it must be a declared dependency."""
    assert "pytz" in _requirement_names(None)
    import duckdb

    value = duckdb.connect().execute("SELECT TIMESTAMPTZ '2026-01-02 03:04:05+00'").fetchone()[0]
    assert value.utcoffset() is not None and value.year == 2026


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel (offline, no build isolation) and unpacked into a folder
    that is not the checkout, as `pip install .` would place it."""
    try:
        import setuptools
    except ImportError:
        pytest.skip("setuptools is not installed in this environment: cannot build the wheel offline")
    version = tuple(int(p) for p in setuptools.__version__.split(".")[:2] if p.isdigit())
    has_wheel = importlib.util.find_spec("wheel") is not None
    if version < (70, 1) and not has_wheel:  # older setuptools builds wheels through `wheel`
        pytest.skip(f"setuptools {setuptools.__version__} without `wheel` cannot build the wheel offline")
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "--no-index", "--disable-pip-version-check", "-q", "-w", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = out.glob("lstar_monitor-*.whl")
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target


@pytest.mark.slow
def test_wheel_ships_templates_and_type_marker(installed_wheel: Path) -> None:
    for name in ("alerts/templates/email.html.j2", "alerts/templates/email.txt.j2",
                 "alerts/templates/email_subject.txt.j2", "reports/templates/report.html.j2",
                 "templates/lab_report.html.j2"):
        assert (installed_wheel / "monitor" / name).is_file(), name
    assert (installed_wheel / "monitor" / "py.typed").is_file()
    assert not (installed_wheel / "tests").exists()


@pytest.mark.slow
def test_installed_package_finds_its_templates_outside_the_checkout(installed_wheel: Path,
                                                                     tmp_path: Path) -> None:
    """The installed copy renders an alert email and loads the report template, run from a
    folder that has no checkout beside it."""
    script = (
        "import monitor, jinja2\n"
        "from pathlib import Path\n"
        "from monitor.alerts.channels.email import DEFAULT_TEMPLATES, TEMPLATE_NAMES\n"
        "from monitor.reports.report import TEMPLATE_DIR, HTML_TEMPLATE\n"
        f"assert Path(monitor.__file__).resolve().is_relative_to(Path({str(installed_wheel)!r}).resolve())\n"
        "env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(DEFAULT_TEMPLATES)))\n"
        "for name in TEMPLATE_NAMES: env.get_template(name)\n"
        "assert (TEMPLATE_DIR / HTML_TEMPLATE).is_file(), TEMPLATE_DIR\n"
        "print('ok', DEFAULT_TEMPLATES)\n"
    )
    # Site-packages of this interpreter for the dependencies, the unpacked wheel first for `monitor`.
    path = [str(installed_wheel), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path[:0] = {path!r}\n{script}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok ") and str(installed_wheel) in proc.stdout
