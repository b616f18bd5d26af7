"""MkDocs hook: the command reference, generated from the `lstar` command tree at build time.

Every top-level command of `monitor.cli.app` gets one page, `reference/<name>.md`, with the
usage line, help text, arguments and options of the command and of each of its subcommands, as
click itself reports them (`typer.main.get_command` walks the same tree `lstar --help` does, with
every command module imported). Nothing is committed: each build writes the pages again, so the
reference cannot fall behind the code, and `tests/test_docs_site.py` builds the site with
`--strict`. The pages are added to the navigation under "Command reference".
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

REFERENCE_DIR = "reference"
NAV_TITLE = "Command reference"

# Characters Markdown would read as markup inside help text; help is shown as the literal text it is.
_MARKUP = re.compile(r"([\\`*_\[\]<>|#])")
_LINE_START_MARKUP = re.compile(r"^(\s*)([-+=>]|\d+[.)])")


def _repo_root(config: Any) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _root_command(config: Any) -> Any:
    root = str(_repo_root(config))
    if root not in sys.path:  # a checkout that is not installed still documents itself
        sys.path.insert(0, root)
    import typer

    from monitor.cli import app

    return typer.main.get_command(app)


def _escape(text: str) -> str:
    return _MARKUP.sub(r"\\\1", text)


def _paragraphs(help_text: str) -> str:
    """Help text as Markdown paragraphs: lines of one paragraph joined, markup escaped."""
    out = []
    for block in re.split(r"\n\s*\n", help_text.replace("\b", "").strip()):
        line = " ".join(part.strip() for part in block.splitlines() if part.strip())
        if line:
            out.append(_LINE_START_MARKUP.sub(r"\1\\\2", _escape(line)))
    return "\n\n".join(out)


def _cell(text: str) -> str:
    return " ".join(_escape(text).split())


def _visible_commands(group: Any, ctx: Any) -> list[tuple[str, Any]]:
    names = group.list_commands(ctx)
    found = [(name, group.get_command(ctx, name)) for name in names]
    return [(name, cmd) for name, cmd in found if cmd is not None and not getattr(cmd, "hidden", False)]


def _command_section(cmd: Any, ctx: Any, depth: int) -> list[str]:
    """One command: heading, help, usage, then its parameters as a table."""
    path = ctx.command_path
    lines = [f"{'#' * depth} `{path}`", ""]
    if cmd.help:
        lines += [_paragraphs(cmd.help), ""]
    lines += ["```text", cmd.get_usage(ctx).strip(), "```", ""]
    arguments, options = [], []
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:  # hidden options
            continue
        (arguments if param.param_type_name == "argument" else options).append(record)
    for title, records in (("Arguments", arguments), ("Options", options)):
        if records:
            lines += [f"**{title}**", "", "| name | description |", "|---|---|"]
            lines += [f"| `{name}` | {_cell(text)} |" for name, text in records]
            lines.append("")
    if hasattr(cmd, "list_commands"):
        for name, sub in _visible_commands(cmd, ctx):
            sub_ctx = sub.context_class(sub, info_name=name, parent=ctx)
            lines += _command_section(sub, sub_ctx, depth + 1)
    return lines


def reference_pages(root: Any) -> dict[str, str]:
    """Markdown of every reference page by its path under docs/: one per top-level command, and an index."""
    root_ctx = root.context_class(root, info_name="lstar")
    pages: dict[str, str] = {}
    index = ["# Command reference", "",
             "Generated from the `lstar` command line itself each time the site is built: what "
             "`lstar COMMAND --help` prints, one page per command. The prose on what each command is "
             "for is in [Commands](../commands.md).", "",
             "| command | what it does |", "|---|---|"]
    for name, cmd in _visible_commands(root, root_ctx):
        ctx = cmd.context_class(cmd, info_name=name, parent=root_ctx)
        pages[f"{REFERENCE_DIR}/{name}.md"] = "\n".join(_command_section(cmd, ctx, 1)).rstrip() + "\n"
        summary = (cmd.get_short_help_str(limit=200) if hasattr(cmd, "get_short_help_str") else "") or ""
        index.append(f"| [`lstar {name}`]({name}.md) | {_cell(summary)} |")
    pages[f"{REFERENCE_DIR}/index.md"] = "\n".join(index) + "\n"
    return pages


_PAGES: dict[str, str] = {}


def on_config(config: Any, **_: Any) -> Any:
    _PAGES.clear()
    _PAGES.update(reference_pages(_root_command(config)))
    entries = [{"Overview": f"{REFERENCE_DIR}/index.md"}]
    entries += [{f"lstar {Path(path).stem}": path} for path in _PAGES if not path.endswith("/index.md")]
    nav = config["nav"]
    if nav is not None:
        nav[:] = [item for item in nav if not (isinstance(item, dict) and NAV_TITLE in item)]
        nav.append({NAV_TITLE: entries})
    return config


def on_files(files: Any, config: Any, **_: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in _PAGES.items():
        files.append(File.generated(config, path, content=content))
    return files
