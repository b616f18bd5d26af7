"""The human-readable outputs beyond the governance report and the alerts (tests/test_escape.py):
command lines printed without the console, the calibrate progress bars, the calibration
campaign's validation.md, the lab report (Markdown, HTML, figures) and a corpus's SOURCES.md.
Each shows a hostile name (ANSI escapes, rich markup, a bidirectional override, a line break,
Markdown and HTML syntax, TeX) as the literal text it is."""

from __future__ import annotations

import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

from markdown_it import MarkdownIt

from monitor.cli import main
from monitor.escape import plain_text

# (the value, how a reader must see it: control characters as visible escapes, written out by hand)
HOSTILE = ("\x1b[31mred\x1b[0m [bold]x[/bold] \u202etxt.exe\n# heading <b>B</b> *em* `tick` a|b $\\bad{$",
           "\\x1b[31mred\\x1b[0m [bold]x[/bold] \\u202etxt.exe\\n# heading <b>B</b> *em* `tick` a|b $\\bad{$")
VALUE, SHOWN = HOSTILE
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
MARKDOWN = MarkdownIt("commonmark").enable("table").enable("strikethrough")
CURVE = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves" / "arith.json"


def parsed(markdown: str) -> tuple[list, list[str]]:
    """The block tokens of `markdown` and the text of each inline run (code spans included),
    after checking that nothing but text, code spans, bold and line breaks arose in it."""
    tokens = MARKDOWN.parse(markdown)
    inline = [t for t in tokens if t.type == "inline"]
    kinds = {c.type for t in inline for c in (t.children or [])}
    assert kinds <= {"text", "code_inline", "softbreak", "strong_open", "strong_close", "em_open", "em_close",
                     "image"}, kinds
    assert not [t for t in tokens if t.type.startswith("html")]
    texts = ["".join(c.content for c in t.children if c.type in ("text", "code_inline")) for t in inline]
    return tokens, texts


def headings(tokens: list) -> list[str]:
    return ["".join(c.content for c in tokens[i + 1].children if c.type in ("text", "code_inline"))
            for i, t in enumerate(tokens) if t.type == "heading_open"]


def table_widths(tokens: list) -> list[set[int]]:
    """Per table, the numbers of cells its rows have (one number: a `|` in a value is no border)."""
    widths: list[set[int]] = []
    cells = 0
    for t in tokens:
        if t.type == "table_open":
            widths.append(set())
        elif t.type == "tr_open":
            cells = 0
        elif t.type in ("th_open", "td_open"):
            cells += 1
        elif t.type == "tr_close":
            widths[-1].add(cells)
    return widths


class Page(HTMLParser):
    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs) -> None:  # type: ignore[no-untyped-def]
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


# -- command lines ---------------------------------------------------------------------------------
def test_corpus_build_and_verify_print_a_hostile_corpus_name_on_one_literal_line(tmp_path: Path, capsys) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("one short document\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"name: {json.dumps(VALUE)}\nversion: v1\nrules:\n  - {{glob: '*.txt', slice: text}}\n")
    out = tmp_path / "corpus"
    assert main(["corpus", "build", str(src), str(out), "--slice-rules", str(rules)]) == 0
    built = capsys.readouterr().out
    assert main(["corpus", "verify", str(out)]) == 0
    verified = capsys.readouterr().out
    for printed, start in ((built, f"built {out}: "), (verified, "OK ")):
        assert printed.startswith(f"{start}{SHOWN} v1: 1 documents")
        assert printed.count("\n") == 1 and not RAW_CONTROLS.search(printed)   # no line forged


def test_reports_choice_of_policy_names_a_hostile_file_literally(tmp_path: Path, capsys) -> None:
    """`lstar report` without --policy says on stderr which file it chose."""
    from monitor.store import Store

    (tmp_path / "state").mkdir()
    Store.open(tmp_path / "state" / "state.duckdb").close()
    (tmp_path / "policies").mkdir()
    name = "p\x1b[2J\u202e\n[red]x.yaml"   # (no "/" in a file name)
    (tmp_path / "policies" / name).write_text(f"name: watched\ntasks:\n  - name: arith\n    curve: {CURVE}\n"
                                              "route: {receiver: log}\nreceivers:\n  - name: log\n"
                                              "    file: {path: alerts.jsonl}\n")
    assert main(["report", "--db", str(tmp_path / "state" / "state.duckdb")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("report: policy ") and "p\\x1b[2J\\u202e\\n[red]x.yaml (the only policy" in err
    assert err.count("\n") == 1 and not RAW_CONTROLS.search(err)


def test_the_calibrate_progress_bars_show_a_hostile_name_on_one_literal_line() -> None:
    from monitor.commands.calibrate import StageBars

    bars = StageBars(show=True)
    bars.progress.console.file = buffer = io.StringIO()
    bars.progress.console.width = 400
    bars("score", 1, 2, VALUE)
    bars.stop()
    shown = buffer.getvalue()
    assert SHOWN in shown and not RAW_CONTROLS.search(shown)
    assert [line for line in shown.splitlines() if line.strip()] == [next(
        line for line in shown.splitlines() if "scoring" in line)]


# -- the calibration report --------------------------------------------------------------------------
def test_the_calibration_report_renders_hostile_names_literally() -> None:
    from monitor.calibrate.outputs import CampaignOutputs, CurveOutcome, report_data, report_markdown
    from monitor.curves import load_curve

    campaign = SimpleNamespace(name=VALUE, fit=SimpleNamespace(model_dump=lambda: {}))
    plan = SimpleNamespace(as_dict=lambda: {"checkpoints": [{"family": VALUE}]})
    ref = SimpleNamespace(describe=lambda: "window 64 ``spec``")
    outputs = CampaignOutputs(curves=[
        CurveOutcome(task=VALUE, metric=VALUE, error=f"no label for {VALUE}"),
        CurveOutcome(task=VALUE, metric="acc", path=Path(f"curves/{VALUE}.json"), curve=load_curve(CURVE),
                     axis_choice={"failed": f"too few points of {VALUE}"})])
    data = report_data(campaign, plan, outputs, corpus_sha256="ab" * 32, ref=ref)  # type: ignore[arg-type]
    data["curves"][1]["summary"]["families"] = [VALUE, "b"]
    markdown = report_markdown(data, outputs)
    assert not RAW_CONTROLS.search(markdown)
    tokens, texts = parsed(markdown)
    assert headings(tokens) == [f"Calibration campaign {SHOWN}", f"{SHOWN} · {SHOWN}", f"{SHOWN} · acc"]
    assert f"Not fitted: no label for {SHOWN}" in texts
    assert f"Not chosen: too few points of {SHOWN}" in texts
    listed = [text for text in texts if "checkpoints, families" in text]
    assert listed and listed[0].endswith(f"families {SHOWN}, b")
    assert any(text.startswith("scoring spec window 64 ``spec``") for text in texts)
    assert any(text.endswith(f"→ {plain_text(Path(f'curves/{VALUE}.json').name)}") for text in texts)


# -- the lab report ------------------------------------------------------------------------------------
def test_the_lab_report_renders_hostile_names_literally(tmp_path: Path) -> None:
    """A rows file whose family, size, task and metric names are hostile: the Markdown parses to
    those names as text (its tables keep their columns), the HTML has no element from them and
    shows them with control characters visible, and the figures are drawn (no `$` read as TeX)."""
    from monitor.lab.analysis import RaceConfig
    from monitor.lab.report import write_race_report
    from monitor.lab.synthetic import synthetic_race_rows

    family, size, task, metric = (f"{VALUE} {what}" for what in ("family", "size", "task", "metric"))
    rows = synthetic_race_rows(seeds=1, steps=6)
    for row in rows:
        row["family"] = f"{family} {row['family']}" if row["family"] == "gpt2" else row["family"]
        row["size"] = size if row["size"] == "small" else row["size"]
        for part in ("metrics", "baselines"):
            row[part] = {task: {metric: row[part]["add-words"]["exact_match"]}}
    config = RaceConfig(resamples=20, threshold_resamples=20, axes=("lstar", "bits_per_byte"))
    data = write_race_report(rows, tmp_path, source={"path": f"rows `{VALUE}`.json", "sha256": "0" * 64},
                             config=config)
    assert data["design"]["sizes"] and (tmp_path / data["plots"][1]["file"]).read_bytes()[:4] == b"\x89PNG"

    markdown = (tmp_path / "lab-report.md").read_text(encoding="utf-8")
    assert not RAW_CONTROLS.search(markdown)
    tokens, texts = parsed(markdown)
    assert f"{SHOWN} task · {SHOWN} metric" in headings(tokens)
    assert not [h for h in headings(tokens) if h.startswith("heading")]
    source = texts[1]
    assert source.startswith(f"Source rows `{SHOWN}`.json (sha256 0000000000000000)")
    assert f"{SHOWN} family gpt2, " in source and f"{SHOWN} size, large; seeds 0" in source
    widths = table_widths(tokens)
    assert widths and all(len(counts) == 1 for counts in widths)
    assert any(text.startswith(f"{SHOWN} family gpt2") for text in texts)      # the per-family table's cell
    assert any(f"{SHOWN} size " in text for text in texts)                    # Δ by size
    images = [c for t in tokens if t.type == "inline" for c in t.children if c.type == "image"]
    assert [i.attrs["src"] for i in images] == [p["file"] for p in data["plots"]]
    title = f"{SHOWN} task · {SHOWN} metric against L*, bits/byte and bytes seen (calib)"
    assert any("".join(c.content for c in i.children) == title for i in images)

    html = (tmp_path / "lab-report.html").read_text(encoding="utf-8")
    assert not RAW_CONTROLS.search(html)
    page = Page(html)
    assert "b" not in page.tags
    shown = "".join(page.text)
    assert f"{SHOWN} task · {SHOWN} metric" in shown and f"{SHOWN} family gpt2" in shown
    # the JSON keeps the exact names
    saved = json.loads((tmp_path / "lab-report.json").read_text(encoding="utf-8"))
    assert {m["task"] for m in saved["metrics"]} == {task} and f"{family} gpt2" in saved["design"]["families"]


def test_the_committed_lab_reports_text_is_unchanged_by_the_escaping() -> None:
    """The committed lab's names are plain: written again from its lab-report.json, the
    Markdown is the committed file's sections byte for byte (the JSON sorts its keys, so the
    tables' column order is compared per table)."""
    from monitor.lab.report import to_markdown

    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "lab-v2" / "report"
    data = json.loads((folder / "lab-report.json").read_text(encoding="utf-8"))
    committed = (folder / "lab-report.md").read_text(encoding="utf-8")
    written = to_markdown(data)
    prose = [line for line in written.splitlines() if not line.startswith("|")]
    assert prose == [line for line in committed.splitlines() if not line.startswith("|")]

    def cells(text: str) -> list[list[str]]:
        return sorted(sorted(line[2:-2].split(" | ")) for line in text.splitlines() if line.startswith("| "))

    assert cells(written) == cells(committed)


# -- SOURCES.md ----------------------------------------------------------------------------------------
def test_a_corpus_sources_file_shows_hostile_names_and_file_names_literally(tmp_path: Path) -> None:
    from monitor.scoring.corpus_build import build_corpus

    src = tmp_path / "src"
    src.mkdir()
    odd = "a|b `c` \x1b[1m.txt"
    (src / odd).write_text("one document\n")
    (src / "plain.txt").write_text("another document\n")
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"name: {json.dumps(VALUE)}\nversion: v1\nrules:\n  - {{glob: '*.txt', slice: text}}\n"
                     "# ```\n")
    build_corpus(src, tmp_path / "corpus", rules)
    sources = (tmp_path / "corpus" / "SOURCES.md").read_text(encoding="utf-8")
    assert not RAW_CONTROLS.search(sources)
    tokens, texts = parsed(sources)
    assert headings(tokens)[0] == f"{SHOWN} v1"
    [fence] = [t for t in tokens if t.type == "fence"]
    assert fence.content == rules.read_text(encoding="utf-8")   # the file whole, its ``` no end of the fence
    assert table_widths(tokens) == [{2}]
    assert plain_text(odd) in texts and "plain.txt" in texts


def test_policy_check_cannot_be_made_to_print_a_forged_verdict_line(tmp_path: Path, capsys) -> None:
    """Scripts read `lstar policy check`'s SUCCESS/FAILED lines: a file name holding a line break
    and a verdict of its own stays on its one line, the break shown as `\\n`."""
    folder = tmp_path / "policies"
    folder.mkdir()
    forged = folder / "a\nSUCCESS evil.yaml"
    forged.write_text("name: [unclosed\n")
    code = main(["policy", "check", str(folder), "--skip-secrets"])
    out = capsys.readouterr().out
    assert code == 2
    lines = out.splitlines()
    assert not any(line.startswith("SUCCESS") for line in lines), out
    assert lines and all(line.startswith("FAILED ") for line in lines), out
    assert "a\\nSUCCESS evil.yaml" in out
