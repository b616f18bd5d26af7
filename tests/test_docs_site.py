"""The documentation site and the README that leads into it.

`mkdocs build --strict` must build `docs/` without a single warning: mkdocs.yml turns every
broken link, missing anchor and page left out of the nav into a warning, and `--strict` into a
failure. The command reference is generated at build time from the CLI
(`docs/hooks/cli_reference.py`); the build here checks it holds every command and option the
command tree has. The README stays short and its links into docs/ must resolve.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250
SETUP_COMMANDS = ('pip install torch==2.13.0 && pip install -e ".[test]" && lstar demo', "python3 -m pytest -q")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("site")
    proc = _build(ROOT / "mkdocs.yml", out)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    warnings = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert not warnings, "\n".join(warnings)
    yield out


def _walk(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    yield command, ctx
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not getattr(sub, "hidden", False):
                yield from _walk(sub, sub.context_class(sub, info_name=name, parent=ctx))


def test_every_command_has_a_generated_reference_page_with_all_its_options(site: Path) -> None:
    import typer

    from monitor.cli import app
    from monitor.commands.catalog import COMMANDS

    # The catalog is the list `lstar --help` prints, kept by hand: each entry needs its page.
    for entry in COMMANDS:
        assert (site / "reference" / entry.name / "index.html").is_file(), entry.name
    root = typer.main.get_command(app)
    root_ctx = root.context_class(root, info_name="lstar")
    checked = 0
    for name in root.list_commands(root_ctx):
        top = root.get_command(root_ctx, name)
        html = (site / "reference" / name / "index.html").read_text(encoding="utf-8")
        for command, ctx in _walk(top, top.context_class(top, info_name=name, parent=root_ctx)):
            assert f"<code>{ctx.command_path}</code>" in html, ctx.command_path
            for param in command.params:
                if getattr(param, "hidden", False):
                    continue
                # an option by its long name (a short alias may come first), an argument by its name
                shown = max(param.opts, key=len) if param.param_type_name == "option" else param.name
                assert re.search(r"<code>[^<]*" + re.escape(shown) + r"(?![\w-])", html), (ctx.command_path, shown)
                checked += 1
    assert checked > 200  # the tree really was walked (today: several hundred parameters)


def test_the_site_has_every_page_of_the_nav(site: Path) -> None:
    for page in _nav_pages():
        built = site / (page[:-3] + "/index.html" if page != "index.md" else "index.html")
        assert built.is_file(), page


def _nav_pages() -> list[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)

    def leaves(node: Any) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from leaves(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from leaves(value)

    return list(leaves(config["nav"]))


def test_every_page_under_docs_is_in_the_nav() -> None:
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts}
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), "a page is listed twice"
    assert pages == set(nav), (sorted(pages - set(nav)), sorted(set(nav) - pages))


@pytest.mark.slow
def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    """The strict build is the guard: a copy of the docs with a bad link must not build.

    Both bad links go into one copy (a build costs about 3 CPU-seconds): each must be reported
    on a warning line of its own, those must be the only warnings, and `--strict` fails the
    build on any warning, so each link alone would fail it too."""
    broken = {"[gone](no-such-page.md)": "link 'no-such-page.md', but the target is not found",
              "[gone](commands.md#no-such-anchor)": "does not contain an anchor '#no-such-anchor'"}
    copy = tmp_path / "broken"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with (copy / "docs" / "layout.md").open("a", encoding="utf-8") as page:
        for link in broken:
            page.write(f"\nSee {link}.\n")
    proc = _build(copy / "mkdocs.yml", copy / "site")
    assert proc.returncode != 0, proc.stderr
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert len(warnings) == len(broken), warnings
    for link, reason in broken.items():
        assert [w for w in warnings if "'layout.md'" in w and reason in w], (link, warnings)


def test_the_readme_is_short_and_keeps_the_two_setup_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}"
    for command in SETUP_COMMANDS:
        assert command in lines, command
    # CI runs exactly the README's test command (.ci/run's last command).
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert ci[-1] == SETUP_COMMANDS[1]


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _headings_slugs(page: Path) -> set[str]:
    slugs, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.+)", line)):
            slugs.add(slugify(re.sub(r"[`*\\]", "", m.group(1)), "-"))
    return slugs


def test_the_readmes_relative_links_resolve() -> None:
    targets = [t for t in _LINK.findall(README.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in targets)
    for target in targets:
        path, _, anchor = target.partition("#")
        file = (ROOT / path) if path else README
        assert file.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in _headings_slugs(file), f"README.md links to {target}: no such heading"


def test_the_link_checks_read_headings_as_the_site_does() -> None:
    """The slug rule used above, on headings whose anchors the site is known to have."""
    assert "corpora-and-the-labs-text-pool" in _headings_slugs(DOCS / "commands.md")
    assert "building-curves-with-lstar-calibrate" in _headings_slugs(DOCS / "commands.md")
