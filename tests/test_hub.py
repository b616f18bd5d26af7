"""Watch rules, incremental polling, rate limits and the circuit breaker, against the fake Hub.

Every Hub call goes through the official client to a real HTTP server on 127.0.0.1
(`monitor.demo.fakehub`); request counts and arrival times come from the server's log.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.errors import HubError, PolicyError
from monitor.hub.client import HubClient, RetryPolicy, rate_limit_wait
from monitor.hub.poll import poll_rule
from monitor.hub.rules import Budgets, WatchRule, load_watch_rules
from monitor.store import MIGRATIONS, Store
from monitor.store.rows import CheckpointRow

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
SMALL = {"config.json": b'{"model_type": "llama"}', "README.md": b"# a test repo\n"}


class FakeClock:
    """An injectable clock: `sleep` advances it instead of waiting."""

    def __init__(self, start: datetime = T0) -> None:
        self.t = start
        self.slept: list[float] = []

    def now(self) -> datetime:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += timedelta(seconds=seconds)

    def seconds(self) -> float:
        return self.t.timestamp()


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    """Keep huggingface_hub's cache, token and telemetry inside the test."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "state.duckdb") as s:
        yield s


@pytest.fixture
def hub():
    with FakeHub() as h:
        yield h


def client_for(hub: FakeHub, store: Store | None, clock: FakeClock | None = None, **policy) -> HubClient:
    clock = clock or FakeClock()
    return HubClient(hub.url, token=False, store=store, clock=clock.now, sleep=clock.sleep,
                     policy=RetryPolicy(**policy))


def add_repos(hub: FakeHub, author: str, n: int, start: datetime = T0) -> dict[str, str]:
    """n small repos one minute apart; {repo: main sha}."""
    return {f"{author}/m{i}": hub.add_repo(f"{author}/m{i}", SMALL, last_modified=start + timedelta(minutes=i),
                                           pipeline_tag="text-generation")
            for i in range(n)}


def rows(store: Store) -> dict[tuple[str, str], CheckpointRow]:
    return {(r.repo, r.sha): r for r in store.list_checkpoints()}


# -- watch rules -------------------------------------------------------------------------------
def test_watch_rule_validation_is_strict():
    rule = WatchRule(name="pythia", author="EleutherAI", name_glob="pythia-*",
                     revisions={"branches": r"step\d+"}, budgets={"max_params": 10})
    assert rule.revisions.matches("branch", "step1000")
    assert not rule.revisions.matches("branch", "step1000-old")      # full match, not search
    assert not rule.revisions.matches("tag", "step1000")             # no tag pattern given
    assert rule.matches_name("EleutherAI/pythia-70m") and not rule.matches_name("EleutherAI/gpt-j")
    assert rule.budgets == Budgets(max_params=10)
    bad = [
        {"name": "x", "author": "a", "colour": "red"},                 # unknown key
        {"name": "x"},                                                 # selects the whole Hub
        {"name": "x", "author": "a", "revisions": {"branches": "("}},  # bad regex
        {"name": "x", "author": "a", "revisions": {}},                 # neither branches nor tags
        {"name": "x", "author": "a", "revisions": "all"},
        {"name": "x", "author": "a", "min_params": 10, "max_params": 5},
        {"name": "x", "author": "a", "budgets": {"max_vocab": 0}},
        {"name": "x y", "author": "a"},
    ]
    for fields in bad:
        with pytest.raises(ValueError):
            WatchRule.model_validate(fields)


def test_rule_key_changes_with_selection_not_with_budgets():
    a = WatchRule(name="r", author="org")
    assert a.key("http://h") == WatchRule(name="r", author="org", budgets={"max_vocab": 5}).key("http://h/")
    assert a.key("http://h") != WatchRule(name="r", author="org", search="x").key("http://h")
    assert a.key("http://h") != a.key("http://other")


def test_load_watch_rules_reports_file_and_key_path(tmp_path):
    good = tmp_path / "rules.yaml"
    good.write_text("watch:\n  - name: a\n    author: org\n  - name: b\n    search: llama\n"
                    "    revisions: {tags: 'v\\d+'}\n")
    assert [r.name for r in load_watch_rules(good)] == ["a", "b"]
    cases = {
        "watch:\n  - name: a\n    author: org\n    budgets: {max_vocab: lots}\n": "watch[0].budgets.max_vocab",
        "watch:\n  - name: a\n    author: org\n    colour: red\n": "watch[0].colour",
        "watch:\n  - name: a\n    author: o\n  - name: a\n    author: p\n": "duplicate rule name",
        "rules: []\n": "top-level `watch:`",
        "watch: [\n": "rules.yaml:",
        "watch:\n  - !!python/object/apply:os.system ['true']\n": "not valid YAML",
    }
    for text, expected in cases.items():
        path = tmp_path / "rules.yaml"
        path.write_text(text)
        with pytest.raises(PolicyError) as err:
            load_watch_rules(path)
        assert expected in str(err.value) and str(path) in str(err.value)


def test_rate_limit_wait_reads_ratelimit_then_retry_after():
    assert rate_limit_wait({"ratelimit": '"api";r=0;t=55', "retry-after": "3"}) == 55
    assert rate_limit_wait({"ratelimit": '"api";r=10;t=55', "retry-after": "3"}) == 3
    assert rate_limit_wait({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0   # a past date: now
    assert rate_limit_wait({}) is None


# -- polling -----------------------------------------------------------------------------------
def test_first_poll_records_every_new_commit_and_second_poll_is_cheap(hub, store):
    heads = add_repos(hub, "org", 6)
    add_repos(hub, "other-org", 2)
    rule = WatchRule(name="org", author="org")
    client = client_for(hub, store)
    first = poll_rule(store, client, rule)
    assert first.error is None and first.new == 6
    found = rows(store)
    assert set(found) == {(repo, sha) for repo, sha in heads.items()}
    assert all(r.status == "discovered" and r.refs == ["main"] and r.rule == "org"
               and r.lineage == r.repo for r in found.values())
    mark = store.get_watermark(rule.key(hub.url))
    assert mark.last_modified == T0 + timedelta(minutes=5) and mark.boundary == ["org/m5"]

    hub.reset_log()
    second = poll_rule(store, client, rule)
    assert second.new == 0 and second.listed == 0
    assert hub.count_requests() <= 2
    assert [r.path for r in hub.requests] == ["/api/models"]
    assert len(store.list_checkpoints()) == 6


def test_poll_stops_at_the_watermark_across_pages(store):
    with FakeHub(page_size=3) as hub:
        add_repos(hub, "org", 10)
        rule = WatchRule(name="org", author="org")
        client = client_for(hub, store)
        assert poll_rule(store, client, rule).new == 10
        assert hub.count_requests("/api/models") == 4           # 10 repos, 3 per page
        hub.reset_log()
        new_sha = hub.add_commit("org/m2", {"weights.txt": b"v2"}, date=T0 + timedelta(hours=1))
        again = poll_rule(store, client, rule)
        assert again.new == 1 and again.listed == 1
        assert hub.count_requests() == 1                        # the first page holds it all
        assert ("org/m2", new_sha) in rows(store) and not again.truncated

        narrow = WatchRule(name="org", author="org", scan_limit=3)   # same selection, same watermark
        for i in range(5):
            hub.add_commit(f"org/m{i}", {"weights.txt": b"v3"}, date=T0 + timedelta(hours=2, minutes=i))
        cut = poll_rule(store, client, narrow)
        assert cut.truncated and cut.new == 3                   # the operator is told what was cut


def test_same_timestamp_repos_are_not_lost_at_the_watermark(hub, store):
    add_repos(hub, "org", 2)
    rule = WatchRule(name="org", author="org")
    client = client_for(hub, store)
    poll_rule(store, client, rule)
    # A repo modified at exactly the watermark time, after the poll: still new.
    late = hub.add_repo("org/late", SMALL, last_modified=T0 + timedelta(minutes=1))
    assert poll_rule(store, client, rule).new == 1
    assert ("org/late", late) in rows(store)
    assert poll_rule(store, client, rule).new == 0


def test_branch_rule_lists_refs_only_for_changed_repos(hub, store):
    sha1 = hub.add_repo("run/a", SMALL, branch="step1", last_modified=T0)
    hub.add_branch("run/a", "main", "step1")
    other = hub.add_repo("run/b", SMALL, last_modified=T0 + timedelta(minutes=1))
    rule = WatchRule(name="steps", author="run", revisions={"branches": r"step\d+"})
    client = client_for(hub, store)
    poll_rule(store, client, rule)
    assert rows(store)[("run/a", sha1)].refs == ["step1"]
    assert ("run/b", other) not in rows(store)                   # no branch matches

    hub.reset_log()
    sha2 = hub.add_commit("run/a", {"w.txt": b"2"}, branch="step2", date=T0 + timedelta(hours=1))
    hub.add_tag("run/a", "v1", "step2")
    result = poll_rule(store, client, rule)
    assert result.new == 1
    assert [r.path for r in hub.requests] == ["/api/models", "/api/models/run/a/refs"]
    assert rows(store)[("run/a", sha2)].refs == ["step2"]

    tags = WatchRule(name="tags", author="run", revisions={"branches": r"step2", "tags": r"v\d+"})
    poll_rule(store, client, tags)
    assert rows(store)[("run/a", sha2)].refs == ["step2", "v1"]    # refs merged, one row
    assert len(store.list_checkpoints()) == 2


def test_name_glob_and_parameter_range_filter_after_listing(hub, store):
    add_repos(hub, "org", 3)
    client = client_for(hub, store)
    poll_rule(store, client, WatchRule(name="g", author="org", name_glob="m[02]"))
    assert sorted(r.repo for r in store.list_checkpoints()) == ["org/m0", "org/m2"]


def test_a_glob_only_rule_polls_by_search_never_the_whole_hub(hub, store, tmp_path):
    """Without author or search, the glob's literal part is sent as `search`: the listing holds
    only repos that can match, so other repos' changes cannot push a release past scan_limit."""
    add_repos(hub, "org", 3)
    wanted = hub.add_repo("lab/Llama-3-8B", SMALL, last_modified=T0 + timedelta(hours=1))
    hub.add_repo("lab/Llama-2-8B", SMALL, last_modified=T0 + timedelta(hours=2))
    client = client_for(hub, store)
    result = poll_rule(store, client, WatchRule(name="l3", name_glob="*Llama-3*", scan_limit=1))
    assert result.error is None and result.new == 1 and not result.truncated
    assert ("lab/Llama-3-8B", wanted) in rows(store) and len(store.list_checkpoints()) == 1
    [listing] = [r for r in hub.requests if r.path == "/api/models"]
    assert listing.query["search"] == ["Llama-3"]

    rules = tmp_path / "rules.yaml"
    rules.write_text("watch:\n  - name: sevens\n    name_glob: '*-7B*'\n")
    with pytest.raises(PolicyError, match=r"rules.yaml: watch\[0\]: .*watch rule 'sevens': name_glob '\*-7B\*' "
                                          r"has no literal part of at least 4 characters"):
        load_watch_rules(rules)
    assert WatchRule(name="ok", author="meta", name_glob="*-7B*").list_params() == {"author": "meta"}


def test_watermark_is_kept_when_the_poll_fails(hub, store):
    sha1 = hub.add_repo("wm/run", SMALL, branch="step1", last_modified=T0)
    hub.add_branch("wm/run", "main", "step1")
    rule = WatchRule(name="steps", author="wm", revisions={"branches": r"step\d+"})
    clock = FakeClock()
    client = client_for(hub, store, clock, attempts=2)
    poll_rule(store, client, rule)
    before = store.get_watermark(rule.key(hub.url))

    sha2 = hub.add_commit("wm/run", {"w": b"2"}, branch="step2", date=T0 + timedelta(hours=1))
    hub.fail_next(2, 503, path_prefix="/api/models/wm/run/refs")
    failed = poll_rule(store, client, rule)
    assert failed.error is not None and "503" in failed.error
    assert store.get_watermark(rule.key(hub.url)) == before
    assert set(rows(store)) == {("wm/run", sha1)}
    assert store.hub_polls(limit=1)[0].ok is False
    assert len(clock.slept) == 1                                   # one backoff between the 2 tries

    hub.fail_next(1, 400, path_prefix="/api/models")               # the listing itself refused
    assert poll_rule(store, client, rule).error is not None
    assert store.get_watermark(rule.key(hub.url)) == before

    recovered = poll_rule(store, client, rule)
    assert recovered.error is None and recovered.new == 1
    assert ("wm/run", sha2) in rows(store)
    assert store.get_watermark(rule.key(hub.url)).last_modified == T0 + timedelta(hours=1)


def test_unreadable_repo_in_branch_mode_is_recorded_skipped(hub, store):
    sha = hub.add_repo("g/locked", SMALL, branch="main", last_modified=T0, gated="manual")
    hub.set_disabled("g/locked")
    rule = WatchRule(name="g", author="g", revisions={"branches": "main"})
    assert poll_rule(store, client_for(hub, store), rule).error is None
    row = rows(store)[("g/locked", sha)]
    assert row.status == "skipped" and "disabled" in row.reason


# -- rate limits and outages ------------------------------------------------------------------
def test_no_request_before_retry_after_real_time(hub, store):
    add_repos(hub, "rl", 1)
    client = HubClient(hub.url, token=False, store=store)
    hub.fail_next(1, 429, retry_after=1, rate_limit_header=False, path_prefix="/api/models/rl/m0")
    info = client.model_info("rl/m0", None, files_metadata=False)
    assert info.id == "rl/m0"
    log = [r for r in hub.requests if r.path.startswith("/api/models/rl/m0")]
    assert [r.status for r in log] == [429, 200]
    assert log[1].time - log[0].time >= 1.0


@pytest.mark.parametrize("ratelimit, retry_after, wait", [(True, None, 55), (False, 7, 7), (True, 3, 3)])
def test_rate_limit_wait_with_injected_clock(ratelimit, retry_after, wait):
    clock = FakeClock()
    with FakeHub(request_clock=clock.seconds) as hub:
        add_repos(hub, "rl", 1)
        client = client_for(hub, None, clock)
        hub.fail_next(1, 429, retry_after=retry_after, rate_limit_header=ratelimit)
        assert client.model_info("rl/m0", None, files_metadata=False).id == "rl/m0"
        first, second = hub.requests
        assert first.status == 429 and second.status == 200
        assert second.time - first.time >= wait
        assert clock.slept == [wait]


def test_long_rate_limit_blocks_every_call_and_survives_restart(hub, store):
    add_repos(hub, "rl", 1)
    clock = FakeClock()
    client = client_for(hub, store, clock)
    hub.fail_next(1, 429, retry_after=3600, rate_limit_header=False)
    with pytest.raises(HubError, match="rate limited until"):
        client.model_info("rl/m0", None)
    assert hub.count_requests() == 1 and clock.slept == []
    clock.t += timedelta(seconds=600)
    restarted = client_for(hub, store, clock)                      # state comes from the store
    with pytest.raises(HubError, match="rate limited"):
        restarted.list_repo_refs("rl/m0")
    assert poll_rule(store, restarted, WatchRule(name="r", author="rl")).error is not None
    assert hub.count_requests() == 1
    clock.t += timedelta(seconds=3001)
    assert restarted.list_repo_refs("rl/m0").branches[0].name == "main"
    assert hub.count_requests() == 2


def test_circuit_opens_after_consecutive_failures_and_records_one_outage(hub, store):
    add_repos(hub, "cb", 1)
    clock = FakeClock()
    client = client_for(hub, store, clock, attempts=2, circuit_threshold=3, circuit_cooldown_s=300)
    hub.set_outage(True)
    with pytest.raises(HubError, match="after 2 tries"):
        client.model_info("cb/m0", None)
    with pytest.raises(HubError, match="circuit open"):
        client.model_info("cb/m0", None)                           # third failure opens it
    assert hub.count_requests() == 3
    for _ in range(5):
        with pytest.raises(HubError, match="circuit open"):
            client.list_repo_refs("cb/m0")
    rule = WatchRule(name="cb", author="cb")
    assert "circuit open" in poll_rule(store, client, rule).error
    with pytest.raises(HubError, match="circuit open"):
        client_for(hub, store, clock).model_info("cb/m0", None)    # a restarted process too
    assert hub.count_requests() == 3
    outages = store.hub_outages()
    assert len(outages) == 1 and outages[0].ended_at is None and outages[0].failures == 3
    assert store.hub_outages(unalerted_only=True)[0].id == outages[0].id
    assert store.mark_hub_outage_alerted(outages[0].id, now=clock.now())
    assert not store.mark_hub_outage_alerted(outages[0].id, now=clock.now())   # one meta-alert

    hub.set_outage(False)
    clock.t += timedelta(seconds=301)
    assert client.model_info("cb/m0", None).id == "cb/m0"
    assert store.hub_outages()[0].ended_at == clock.now()
    assert store.get_hub_state(hub.url).consecutive_failures == 0
    assert poll_rule(store, client, rule).new == 1


# -- CLI ----------------------------------------------------------------------------------------
def test_poll_and_checkpoints_cli(hub, tmp_path, capsys):
    from monitor.cli import main

    heads = add_repos(hub, "cli", 2)
    rules = tmp_path / "rules.yaml"
    rules.write_text("watch:\n  - name: cli\n    author: cli\n")
    db = tmp_path / "cli.duckdb"
    code = main(["poll", "--once", "--rule-file", str(rules), "--db", str(db), "--endpoint", hub.url,
                 "--no-gate", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["rules"][0]["new"] == 2 and report["gate"] == []

    assert main(["checkpoints", "--db", str(db), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["items"]
    assert {(r["repo"], r["sha"], r["status"]) for r in listed} == \
        {(repo, sha, "discovered") for repo, sha in heads.items()}
    assert main(["checkpoints", "--db", str(db), "--status", "gated", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == []
    assert main(["checkpoints", "--db", str(db)]) == 0
    assert "cli/m1" in capsys.readouterr().out

    code = main(["poll", "--once", "--rule-file", str(rules), "--db", str(db), "--endpoint", hub.url,
                 "--cache-dir", str(tmp_path / "cache"), "--json"])
    gated = json.loads(capsys.readouterr().out)["gate"]
    assert code == 0 and len(gated) == 2                     # the gate ran on the discovered rows
    assert all(g["status"] == "skipped" and "no model.safetensors" in g["reason"] for g in gated)

    assert main(["checkpoints", "--db", str(db), "--status", "bogus"]) == 2
    assert main(["poll", "--rule-file", str(rules), "--db", str(db)]) == 2      # --once is required
    assert "--once" in capsys.readouterr().err
    hub.fail_next(1, 400, path_prefix="/api/models")
    code = main(["poll", "--once", "--rule-file", str(rules), "--db", str(db), "--endpoint", hub.url,
                 "--no-gate"])
    assert code == HubError.exit_code
    assert "error: the Hub failed during the poll (cli:" in capsys.readouterr().err


# -- migrations ---------------------------------------------------------------------------------
def test_older_schema_upgrades_in_place(tmp_path):
    path = tmp_path / "old.duckdb"
    with Store.open(path, migrate=False) as old:
        assert old.migrate(MIGRATIONS[:1]) == ["0001_scoring"]
        old.conn.execute("INSERT INTO checkpoints (repo, sha, source, lineage, discovered_at, updated_at, "
                         "status) VALUES ('org/a', 'abc', 'hub', 'org/a', now(), now(), 'discovered')")
    with Store.open(path) as upgraded:                       # opening read-write migrates
        assert upgraded.applied_migrations() == sorted(m.name for m in MIGRATIONS)
        assert upgraded.pending_migrations() == []
        assert [r.repo for r in upgraded.list_checkpoints()] == ["org/a"]
        assert upgraded.get_watermark("nothing") is None
        assert upgraded.migrate() == []                      # a second migrate is a no-op
    assert [m.name for m in MIGRATIONS] == sorted(m.name for m in MIGRATIONS)


def test_poll_reads_watch_rules_from_a_policy_file():
    from monitor.commands.poll import load_rules

    example = Path(__file__).resolve().parent.parent / "policies" / "example.yaml"
    (rule,) = load_rules(example, None)
    assert isinstance(rule, WatchRule) and rule.name == "pythia-steps"
    assert rule.revisions.matches("branch", "step143000")


# -- request counting ----------------------------------------------------------------------------
def test_every_page_retry_and_redirect_is_counted_as_the_fake_hub_served_it(store):
    """The client's request count is the number of HTTP requests the Hub answered: each page of a
    listing, a page retried after a 503, and both hops of a download redirected to a CDN."""
    with FakeHub(page_size=3, cdn_redirect=True) as hub:
        add_repos(hub, "org", 10)
        client = client_for(hub, store)
        hub.reset_log()
        result = poll_rule(store, client, WatchRule(name="org", author="org"))
        assert result.new == 10 and hub.count_requests("/api/models") == 4   # 10 repos, 3 per page
        assert result.requests == client.requests == hub.count_requests() == 4

        hub.add_repo("org/big", {"model.safetensors": bytes(300_000), **SMALL})
        hub.reset_log()
        before = client.requests
        client.download("org/big", "model.safetensors", "main", cache_dir=hub_cache(store))
        assert [r.status for r in hub.requests] == [302, 200]    # the HEAD's redirect, the CDN's GET
        assert client.requests - before == 2
        hub.reset_log()
        client.read_range("org/big", "model.safetensors", "main", 0, 8)   # the GET follows the 302
        assert [r.status for r in hub.requests] == [302, 206]
        assert client.requests - before == 4

        hub.reset_log()
        hub.fail_next(1, 503, path_prefix="/api/models")
        before = client.requests
        assert len(list(client.iter_models(author="org", limit=3))) == 3
        assert client.requests - before == hub.count_requests() == 2  # the 503 and its retry


def hub_cache(store: Store) -> Path:
    return Path(store.path).parent / "cache"
