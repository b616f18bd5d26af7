"""What a non-editable install ships, and that production code imports only what it declares.

A green run on a developer's machine once hid an undeclared dependency; these checks read the
package as it is installed from its wheel, and the imports as the source states them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from import_graph import all_modules, imports, module_graph, module_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "monitor"
# Modules that exist to use an optional extra, imported only when that feature is asked for.
EXTRA_MODULES = {PACKAGE / "scoring" / "backends" / "ray.py": "ray",
                 PACKAGE / "calibrate" / "evaluate.py": "bench",
                 PACKAGE / "curves" / "eval_child.py": "bench"}


def _production_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _shipped_packages() -> list[str]:
    """The packages the wheel ships, found as setuptools finds them with pyproject's own
    `[tool.setuptools.packages.find]` settings."""
    import tomllib

    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    where = find.get("where", ["."])
    return sorted(p for w in where for p in find_packages(str(ROOT / w), include=find.get("include", ("*",)),
                                                          exclude=find.get("exclude", ())))


# What only the tests use: a package by one of these names, or a module importing these.
TEST_PACKAGE_NAMES = {"testing", "tests", "test", "support", "sandbox", "conftest"}
TEST_LIBRARIES = {"pytest", "_pytest", "support", "import_graph"}


def test_the_wheel_ships_the_package_and_no_test_code() -> None:
    """Users install what they run: every package under monitor/ (the demo's fake Hub and
    receivers included, `lstar demo` runs them) and nothing the tests alone use."""
    shipped = _shipped_packages()
    on_disk = sorted(module_name(p.parent) for p in PACKAGE.rglob("__init__.py"))
    assert shipped == on_disk, set(shipped) ^ set(on_disk)
    assert {"monitor", "monitor.demo", "monitor.lab", "monitor.service"} <= set(shipped)
    named_for_tests = [p for p in shipped if set(p.split(".")) & TEST_PACKAGE_NAMES]
    assert not named_for_tests, f"test code in the wheel: {named_for_tests}"
    test_imports = [f"{path.relative_to(ROOT)}:{imp.line} imports {imp.module}" for path in _production_modules()
                    for imp in imports(path) if imp.module.split(".")[0] in TEST_LIBRARIES]
    assert not test_imports, "shipped modules import test code:\n" + "\n".join(test_imports)


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
    missing = []
    for path in _production_modules():  # monitor/demo included: `lstar demo` runs its fake Hub
        allowed = core
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


def _demo_import_graph() -> dict[str, Path]:
    """Every module `lstar demo` may import: what `lstar` loads to parse its command line
    (monitor.cli and the command modules it imports by name), and everything the demo's command
    and `monitor.demo` reach, imports inside functions included. The modules of optional extras
    are left out: they run only when their feature is asked for, and the demo asks for none."""
    from monitor.cli import COMMAND_MODULES

    modules = all_modules()
    optional = {module_name(p) for p in EXTRA_MODULES}
    module_level, everything = module_graph(module_level_only=True), module_graph(module_level_only=False)

    def parents(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts))]

    seen: set[str] = set()
    todo = [(m, module_level) for m in ("monitor.cli", *(f"monitor.commands.{c}" for c in COMMAND_MODULES))]
    todo += [("monitor.commands.demo", everything), ("monitor.demo.run", everything)]
    visited: set[tuple[str, int]] = set()
    while todo:
        name, graph = todo.pop()
        if name in optional or name not in modules or (name, id(graph)) in visited:
            continue
        visited.add((name, id(graph)))
        seen.add(name)
        todo += [(m, graph) for m in (*graph[name], *parents(name))]
    return {name: modules[name] for name in sorted(seen)}


def test_the_demo_needs_only_the_core_dependencies() -> None:
    """`pip install -e .` without extras, then `lstar demo`: every third-party package the demo
    can import is a core dependency, never one of an extra."""
    stdlib = set(sys.stdlib_module_names)
    dists = importlib.metadata.packages_distributions()
    core = _requirement_names(None)
    graph = _demo_import_graph()
    assert {"monitor.demo.run", "monitor.demo.receivers", "monitor.demo.fakehub",
            "monitor.service.daemon"} <= set(graph)
    missing = []
    for name, path in graph.items():
        for imp in imports(path):
            top = imp.module.split(".")[0]
            if not imp.runs or top in stdlib or top in ("monitor", "__future__"):
                continue
            owners = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
            if not owners & core:
                missing.append(f"{path.relative_to(ROOT)}:{imp.line} imports {top} ({sorted(owners)})")
    assert not missing, "the demo imports packages that are not core dependencies:\n" + "\n".join(missing)


@pytest.mark.slow
def test_the_demo_starts_in_a_venv_without_extras(tmp_path: Path) -> None:
    """A fresh virtualenv, `pip install torch==2.13.0` then `pip install -e .` (no extras), as a
    user would: `lstar demo --help` works and the demo's modules import.

    The virtualenv is made without a pip of its own: this interpreter's pip installs into it
    (`pip --python`, the same pip run by the virtualenv's interpreter, installing into its
    site-packages). Installing pip and setuptools into it (ensurepip, which byte-compiles them)
    cost 4.7 to 6.2 CPU-seconds of the test's 55, and neither is what the demo needs: without
    them, a demo that needed setuptools at run time would fail here."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    pins = re.findall(r"torch==[0-9][0-9A-Za-z.+]*", (ROOT / ".ci" / "run").read_text())
    for args in ([pins[0]], ["-e", str(ROOT)]):
        # --no-compile: pip would byte-compile every module of torch, transformers and the rest
        # (over 5,000 files) though the checks below import a fraction of them; Python compiles
        # what they import as it imports it, and the files installed are the same.
        proc = subprocess.run([*pip, "install", "-q", "--no-compile", *args],
                              capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    listed = subprocess.run([*pip, "list", "--format=freeze"], capture_output=True,
                            text=True, timeout=300, env=env).stdout.lower()
    assert "torch==" in listed and "lstar-monitor==" in listed and "pip==" not in listed, listed
    assert "pytest==" not in listed and "gguf==" not in listed  # no test extra slipped in
    help_ = subprocess.run([str(venv / "bin" / "lstar"), "demo", "--help"], capture_output=True, text=True,
                           timeout=300, env=env, cwd=tmp_path)
    assert help_.returncode == 0 and "--workdir" in help_.stdout, help_.stderr[-3000:]
    script = ("import monitor, monitor.demo.run, monitor.demo.receivers, monitor.demo.fakehub\n"
              "from monitor.demo.receivers import SmtpReceiver, WebhookReceiver\n"
              "from monitor.store import Store\n"   # the state: duckdb and what it reads through
              "with Store.open('state.duckdb') as store: store.query('SELECT 1')\n"
              "with SmtpReceiver() as smtp, WebhookReceiver() as hook: print(monitor.__file__, smtp.port > 0)\n")
    proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[0].startswith(str(ROOT)) and proc.stdout.split()[1] == "True", proc.stdout


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
    top = {p.name for p in installed_wheel.iterdir() if not p.name.endswith(".dist-info")}
    assert top == {"monitor"}, top
    folders = {p.relative_to(installed_wheel).as_posix() for p in installed_wheel.rglob("*") if p.is_dir()}
    assert not {f for f in folders if set(f.split("/")) & TEST_PACKAGE_NAMES}, folders
    assert {"monitor/demo", "monitor/lab", "monitor/service"} <= folders
    assert (installed_wheel / "monitor" / "demo" / "fakehub.py").is_file()
    # the demo's shipped history curve is package data: `lstar demo` from a wheel needs it
    assert (installed_wheel / "monitor" / "demo" / "data" / "add-words-curve.json").is_file()


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
