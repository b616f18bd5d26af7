"""Hostile names from the Hub are shown literally in every human-readable format: the Markdown
report (parsed with a CommonMark parser), the email's text and HTML parts, the webhook's
annotations (its labels and numbers keep the exact values) and the terminal.

Each hostile value is a repo name, a branch name and a file name in the refusal reason of a
checkpoint the poller listed and, scored, the subject of an alert."""

from __future__ import annotations

import json
import random
import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from monitor.alerts import Dispatcher, evaluate_pending
from monitor.alerts.channels.base import Outgoing
from monitor.alerts.channels.email import render
from monitor.cli import main
from monitor.escape import markdown_code, markdown_text, plain_text, terminal_text
from monitor.hub.poll import Candidate
from monitor.policy.load import load_policy
from monitor.reports.report import build_report, to_html, to_markdown
from support.scores import record_fake_score

CURVE = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves" / "arith.json"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)

# (the value, how a reader must see it: control characters as visible escapes, written out by hand)
HOSTILE = [
    ("<b>ALL CLEAR</b>", "<b>ALL CLEAR</b>"),
    ("[Click to re-run](https:evil.example)", "[Click to re-run](https:evil.example)"),
    ("tick`tock", "tick`tock"),
    ("left|right", "left|right"),
    ("model\n# heading", "model\\n# heading"),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("[bold]x[/bold]", "[bold]x[/bold]"),
    ("\u202etxt.exe", "\\u202etxt.exe"),
    ("1. *star* _under_ &amp; ~~gone~~ \\", "1. *star* _under_ &amp; ~~gone~~ \\"),
]
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def sha(i: int) -> str:
    return f"{i:x}" * 40


@pytest.fixture
def hostile(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A policy whose file receiver records the webhook body, and a store where every hostile
    value is a scored repo (alerted), a listed repo's branch and a refused file's name."""
    from monitor.store import Store

    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(f"name: watched\ntasks:\n  - name: arith\n    curve: {CURVE}\n"
                           "route: {receiver: log, group_wait: 0s, group_interval: 0s}\nreceivers:\n"
                           "  - name: log\n    file: {path: alerts.jsonl}\n")
    policy = load_policy(policy_file)
    store = Store.open(tmp_path / "state.duckdb")
    listed = [Candidate(f"org/{value}", sha(i + 1), (value,), status="skipped",
                        reason=f"refused: model.safetensors names the tensor {value}")
              for i, (value, _) in enumerate(HOSTILE)]
    store.record_discoveries("rule-key", "watch", "http://hub.invalid", listed, watermark=None, boundary=[],
                             now=T0 - timedelta(minutes=5), requests=1, listed=len(listed))
    for i, (value, _) in enumerate(HOSTILE):
        record_fake_score(store, repo=value, sha="c" * 40, lstar=-2.0, se=0.02, finished_at=T0 + timedelta(seconds=i))
    evaluate_pending(store, [policy], now=T0 + timedelta(minutes=1))
    Dispatcher(store, [policy], rng=random.Random(1), owner="t").run_once(T0 + timedelta(minutes=1))
    yield store, policy, tmp_path
    store.close()


# -- Markdown ------------------------------------------------------------------------------------
MARKDOWN = MarkdownIt("commonmark").enable("table").enable("strikethrough")
INLINE_TYPES = {"text", "strong_open", "strong_close", "em_open", "em_close", "code_inline", "softbreak"}


def rendered_text(inline) -> str:  # type: ignore[no-untyped-def]
    return "".join(c.content for c in inline.children if c.type in ("text", "code_inline"))


def test_the_markdown_report_shows_hostile_names_as_literal_text(hostile) -> None:  # type: ignore[no-untyped-def]
    store, policy, _ = hostile
    data = build_report(store, policy, now=T0 + timedelta(hours=1), period_start=T0 - timedelta(days=1))
    markdown = to_markdown(data)
    tokens = MARKDOWN.parse(markdown)
    assert not RAW_CONTROLS.search(markdown)
    inline = [t for t in tokens if t.type == "inline"]
    # no link, image, raw HTML, strikethrough or emphasis arises from a value (the report's own
    # bold states are `strong`); no heading but the report's own
    assert {c.type for t in inline for c in t.children} <= INLINE_TYPES
    assert not [t for t in tokens if t.type.startswith("html")]
    headings = [rendered_text(tokens[i + 1]) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert not [h for h in headings if "heading" in h]
    # every table row keeps its columns (a `|` in a value is no cell border)
    for i, t in enumerate(tokens):
        if t.type == "table_open":
            end = next(j for j in range(i, len(tokens)) if tokens[j].type == "table_close")
            rows = [tokens[j:end] for j in range(i, end) if tokens[j].type == "tr_open"]
            cells = {sum(x.type in ("th_open", "td_open") for x in r[:next(k for k, x in enumerate(r) if
                                                                          x.type == "tr_close")]) for r in rows}
            assert len(cells) == 1
    texts = [rendered_text(t) for t in inline]
    for i, (value, shown) in enumerate(HOSTILE):
        # the new-checkpoints list: `org/<value>@<value> (sha7): skipped (refused: ...)`, round-tripped
        assert (f"org/{shown}@{shown} ({sha(i + 1)[:7]}): skipped (refused: model.safetensors names the "
                f"tensor {shown})") in texts
        # the L* table's cell of the scored repo
        assert f"{shown}@cccccccccccc" in texts


def test_markdown_escapes_round_trip_through_a_commonmark_parser_in_every_context() -> None:
    contexts = ["| {} | b |\n|---|---|\n| {} | y |\n", "- {}: tail\n", "### {} (m)\n", "> problem: {}\n"]
    alphabet = list("\\`*_[]()<>#+-!|~&;:.=\"' a1\n\x1b\u202e") + ["&amp;", "&#x202e;", "](x)", "1.", "---", "    "]
    rng = random.Random(5)
    values = [v for v, _ in HOSTILE] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
                                        for _ in range(1500)]
    for value in values:
        for context in contexts:
            tokens = MARKDOWN.parse(context.format(markdown_text(value), markdown_text(value)))
            assert {t.type.rsplit("_", 1)[0] for t in tokens} <= {
                "table", "thead", "tbody", "tr", "th", "td", "inline", "bullet_list", "list_item", "paragraph",
                "heading", "blockquote"}, (value, context)
            inline = [t for t in tokens if t.type == "inline"]
            assert {c.type for t in inline for c in t.children} <= {"text", "softbreak"}, (value, context)
            text = "".join(rendered_text(t) for t in inline)
            assert "".join(plain_text(value).split()) in "".join(text.split()), (value, context)
        # a code span holds the value whatever backticks it has
        [paragraph] = [t for t in MARKDOWN.parse(f"see {markdown_code(value)} here") if t.type == "inline"]
        assert [c.content for c in paragraph.children if c.type == "code_inline"] == (
            [plain_text(value)] if value else [])



def test_gfm_renders_no_link_from_a_bare_url_or_www_name() -> None:
    """GitHub's own renderer (cmark-gfm, with its autolink extension) links bare `https://…`
    and `www.…` text, which CommonMark leaves alone; escaped, the same text renders unlinked and
    reads the same. (A bare e-mail address is linked by GFM whatever is escaped: the docstring of
    `monitor.escape` says so, and this test pins that the limit is still the only one.)"""
    import cmarkgfm

    def gfm(text: str) -> str:
        return cmarkgfm.github_flavored_markdown_to_html(text)

    for value in ["https://evil.example/re-run", "see HTTP://x.example now", "www.evil.example/path",
                  "ftp://a.example", "(www.evil.example)", "*https://e.example*"]:
        assert "<a " in gfm(value), value                      # the renderer would link the raw text
        html = gfm(f"- {markdown_text(value)}: tail")
        assert "<a " not in html, (value, html)
        parser = Elements()
        parser.feed(html)
        assert "".join(parser.text).strip() == f"{value}: tail", (value, html)
    assert "<a " in gfm(markdown_text("write to a@b.example"))   # the documented limit

# -- email ---------------------------------------------------------------------------------------
class Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:  # type: ignore[no-untyped-def]
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def sent(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "alerts.jsonl").read_text(encoding="utf-8").splitlines()]


def test_the_email_text_and_html_show_hostile_names_literally(hostile) -> None:  # type: ignore[no-untyped-def]
    _, _, folder = hostile
    lines = sent(folder)
    texts, pages = [], []
    for line in lines:
        subject, text, html = render(Outgoing(line["id"], line["policy"], "mail", line["message"]))
        assert "\n" not in subject and not RAW_CONTROLS.search(subject)
        assert not RAW_CONTROLS.search(text) and not RAW_CONTROLS.search(html)
        assert not [x for x in text.splitlines() if x.startswith("# heading")]
        page = Elements()
        page.feed(html)
        assert "b" not in page.tags and "a" not in page.tags   # neither `<b>` nor a link came from a value
        texts.append(text)
        pages.append("".join(page.text))
    for value, shown in HOSTILE:
        assert any(re.search(rf"arith (at risk|emerged) for {re.escape(shown)}@cccccccccccc", t) for t in texts)
        assert any(f"{shown}@cccccccccccc" in p for p in pages)
        assert any(f"repo={shown}" in t for t in texts)


# -- webhook -------------------------------------------------------------------------------------
def test_the_webhook_keeps_exact_labels_and_sends_plain_text_annotations(hostile) -> None:  # type: ignore
    _, _, folder = hostile
    bodies = [line["message"] for line in sent(folder)]
    alerts = [a for body in bodies for a in body["alerts"]]
    assert sorted(a["labels"]["repo"] for a in alerts) == sorted(v for v, _ in HOSTILE)   # data: exact
    for alert in alerts:
        shown = dict(HOSTILE)[alert["labels"]["repo"]]
        assert not any(RAW_CONTROLS.search(text) for text in alert["annotations"].values())
        assert alert["annotations"]["summary"].endswith(f" for {shown}@cccccccccccc")
    assert all(not RAW_CONTROLS.search(v) for body in bodies for v in body["commonAnnotations"].values())


# -- terminal ------------------------------------------------------------------------------------
def test_the_terminal_prints_hostile_names_literally(hostile, capsys, monkeypatch) -> None:  # type: ignore
    store, _, folder = hostile
    store.close()   # the commands open the file themselves
    monkeypatch.setenv("COLUMNS", "1000")
    db = str(folder / "state.duckdb")
    assert main(["checkpoints", "--db", db, "--status", "skipped"]) == 0
    listed = capsys.readouterr().out
    assert main(["alerts", "list", "--db", db]) == 0
    alerts = capsys.readouterr().out
    for out in (listed, alerts):
        assert not RAW_CONTROLS.search(out)
    for value, shown in HOSTILE:
        if "\n" not in value:  # a line break in a cell is the table's own (see monitor.escape)
            assert f"org/{shown}" in listed and f"tensor {shown}" in listed
            assert f"{shown}@cccccccccccc" in alerts


def test_error_lines_show_control_characters_as_escapes(tmp_path: Path, capsys) -> None:
    path = tmp_path / "policy\x1b[2J\u202e.yaml"
    assert main(["report", "--policy", str(path), "--db", str(tmp_path / "state.duckdb")]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "policy\\x1b[2J\\u202e.yaml" in err and not RAW_CONTROLS.search(err)
    assert main(["policy", "check", str(path)]) != 0
    out = capsys.readouterr().out
    assert out.startswith("FAILED ") and "policy\\x1b[2J\\u202e.yaml" in out and not RAW_CONTROLS.search(out)


def test_terminal_text_keeps_line_breaks_and_shows_every_other_control() -> None:
    assert terminal_text("a\nb\tc\x1b[1m\r\x9b\u2028\u202e") == "a\nb\tc\\x1b[1m\\r\\x9b\\u2028\\u202e"
    assert plain_text("a\nb\tc") == "a\\nb\\tc"


def test_the_html_report_neutralises_bidi_and_control_characters(hostile) -> None:  # type: ignore[no-untyped-def]
    store, policy, _ = hostile
    data = build_report(store, policy, now=T0 + timedelta(hours=1), period_start=T0 - timedelta(days=1))
    data["plots"] = []
    html = to_html(data, {})
    assert not RAW_CONTROLS.search(html)
    page = Elements()
    page.feed(html)
    assert "b" not in page.tags
    assert "org/\\u202etxt.exe@\\u202etxt.exe" in "".join(page.text)


@pytest.mark.parametrize("value", ["org/m\x1b[31mALL_CLEAR\x1b[0m", "a\rforged", "x\u202eevil", "a\u2028b",
                                   "back\\slash", "tab\there"])
def test_the_event_log_line_never_carries_a_control_character_raw(value, caplog):
    from monitor.events import event

    with caplog.at_level("INFO", logger="lstar.events"):
        event("checkpoint_found", repo=value, n=3)
    [record] = [r for r in caplog.records if r.name == "lstar.events"]
    line = record.getMessage()
    assert line == f"checkpoint_found repo={json.dumps(value)} n=3"
    assert all(c.isprintable() for c in line)
