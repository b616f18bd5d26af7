"""Fine-tunes tried offline (issue 38, item 7): the guide's fake Hub holds a full fine-tune and a
LoRA adapter of its watched base; a watch rule follows the derivatives of a base through the
Hub's `base_model:` search filter; `lstar score ./folder` records the base its model card names;
`policy check` warns when `derivatives: residual` has no labelled pairs to work from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load as load_safetensors

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_derivatives, add_lineage, scenario_guide
from monitor.errors import PolicyError
from monitor.hub.client import HubClient, RetryPolicy
from monitor.hub.gate import gate_pending
from monitor.hub.poll import poll_once
from monitor.hub.rules import WatchRule, load_watch_rules
from monitor.store import Store

BASE = "demo-org/pythia-tiny"


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


def test_the_guide_scenario_holds_a_finetune_and_a_safetensors_only_adapter_of_its_watched_base(tmp_path) -> None:
    from huggingface_hub import HfApi

    with FakeHub() as hub:
        described = scenario_guide(hub, tmp_path)
        api = HfApi(endpoint=hub.url, token=False)
        found = {relation: sorted(m.id for m in api.list_models(filter=f"base_model:{relation}{BASE}"))
                 for relation in ("", "finetune:", "adapter:", "quantized:")}
        base = hub.files(BASE, "main")
        chat = hub.files("tune-org/pythia-tiny-chat", "main")
        lora = hub.files("tune-org/pythia-tiny-lora", "main")
    assert sorted(described["derivatives"]) == ["tune-org/pythia-tiny-chat", "tune-org/pythia-tiny-lora"]
    # What the official client's `filter=` finds, by the tags the Hub derives from each card.
    assert found == {"": ["tune-org/pythia-tiny-chat", "tune-org/pythia-tiny-lora"],
                     "finetune:": ["tune-org/pythia-tiny-chat"], "adapter:": ["tune-org/pythia-tiny-lora"],
                     "quantized:": []}
    # The adapter is safetensors only: its config and weights, no weights of a model, no pickle.
    assert sorted(lora) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert json.loads(lora["adapter_config.json"])["base_model_name_or_path"] == BASE
    assert all(".lora_A." in k or ".lora_B." in k for k in load_safetensors(lora["adapter_model.safetensors"]))
    # The fine-tune has every weight of its base, each moved.
    tuned, original = load_safetensors(chat["model.safetensors"]), load_safetensors(base["model.safetensors"])
    assert sorted(tuned) == sorted(original)
    assert all(tuned[k].shape == original[k].shape and not tuned[k].equal(original[k]) for k in original)
    assert b"base_model: demo-org/pythia-tiny" in chat["README.md"]


def test_a_derivatives_of_rule_polls_the_base_model_filter_and_the_gate_pins_each_to_the_base(tmp_path) -> None:
    rule = WatchRule(name="tunes", derivatives_of=BASE)
    adapters = WatchRule(name="adapters", derivatives_of=BASE, relation="adapter")
    assert rule.list_params() == {"filter": f"base_model:{BASE}"}
    assert adapters.list_params() == {"filter": f"base_model:adapter:{BASE}"}
    store = Store.open(tmp_path / "state.duckdb")
    with FakeHub() as hub:
        refs = add_lineage(hub, BASE, steps=(1000, 2000), build_dir=tmp_path / "build")
        add_lineage(hub, "demo-org/other", steps=(1000,), build_dir=tmp_path / "build", seed=7)
        shas = add_derivatives(hub, BASE)
        client = HubClient(hub.url, token=False, store=store, policy=RetryPolicy(attempts=1))
        polls = poll_once(store, client, [rule, adapters])
        outcomes = {o.repo: o for o in gate_pending(store, client, [rule, adapters], cache_dir=tmp_path / "hf" / "hub")}
    assert [(p.error, p.candidates) for p in polls] == [(None, 2), (None, 1)]
    rows = store.list_checkpoints()
    # Neither the base nor an unrelated repo is listed: only what names the base in its card
    # (the adapter once, found first by the rule that lists every relation).
    assert sorted((r.repo, r.sha, r.rule) for r in rows) == sorted(
        (repo, sha, "tunes") for repo, sha in shas.items())
    assert all(o.status == "gated" for o in outcomes.values()), outcomes
    for row in rows:
        base = store.checkpoint_base(row.id)
        assert (base["base_repo"], base["base_sha"]) == (BASE, refs["main"]), base
        assert base["relation"] == ("adapter" if row.repo.endswith("-lora") else "finetune")
    store.close()


@pytest.mark.parametrize("body, expected", [
    ("watch:\n  - name: t\n    search: 'base_model:demo-org/pythia-tiny'\n", "derivatives_of: ORG/BASE"),
    ("watch:\n  - name: t\n    relation: adapter\n    author: x\n", "give derivatives_of"),
    ("watch:\n  - name: t\n    derivatives_of: ../etc\n", "watch[0].derivatives_of"),
    ("watch:\n  - name: t\n    derivatives_of: org/base\n    relation: distilled\n", "watch[0].relation"),
])
def test_a_derivatives_rule_is_refused_when_it_cannot_be_sent_as_the_base_model_filter(tmp_path, body, expected) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(body)
    with pytest.raises(PolicyError) as err:
        load_watch_rules(path)
    assert expected in err.value.message


def test_a_rule_without_derivatives_of_keeps_its_watermark_key() -> None:
    # Adding the field must not restart existing rules: the key is the one computed by hand
    # from the selection as it was before derivatives_of existed.
    import hashlib

    rule = WatchRule(name="w", author="demo-org", name_glob="pythia-*")
    selection = {"author": "demo-org", "name_glob": "pythia-*", "search": None, "pipeline_tag": None,
                 "min_params": None, "max_params": None, "revisions": "main"}
    blob = json.dumps({"endpoint": "http://h", **selection}, sort_keys=True)
    assert rule.key("http://h/") == f"w:{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
    assert WatchRule(name="w", derivatives_of="a/b").key("http://h") != WatchRule(name="w", derivatives_of="a/c").key("http://h")


# The folders' scores are checked for the base their cards name, not for the model: the
# 1,000-id toy tokenizer spares each of the five scores most of gpt-neox's 50,277-id output layer.
TOKENIZER = "spm-unigram-toy"


def _write(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def _score(folder: Path, corpus: Path, state: Path) -> None:
    from monitor.cli import main

    assert main(["score", str(folder), "--corpus", str(corpus), "--docs", "2", "--max-context", "32",
                 "--device", "cpu", "--dtype", "float32", "--no-tcb", "--quiet", "--state", str(state)]) == 0


def test_scoring_a_local_folder_records_the_base_its_model_card_names(tmp_path, calib_v0, capsys, monkeypatch) -> None:
    from monitor.cli import main
    from monitor.demo.hub_repos import derivative_card, tiny_model_files

    state = tmp_path / "state"
    state.mkdir()
    base = tiny_model_files(TOKENIZER, build_dir=tmp_path / "build")
    with FakeHub() as hub:   # what a poll of the base saw: its `main` commit, offline from then on
        main_sha = hub.add_repo(BASE, base)
        with Store.open(state / "lstar.duckdb") as store:
            poll_once(store, HubClient(hub.url, token=False, store=store, policy=RetryPolicy(attempts=1)),
                      [WatchRule(name="base", author="demo-org")])
    pinned = "ab" * 20
    ft = _write(tmp_path / "ft-model", {**base, "README.md": derivative_card(BASE, "finetune")})
    named = _write(tmp_path / "pinned-ft", {**base, "model.safetensors": tiny_model_files(
        TOKENIZER, seed=9, build_dir=tmp_path / "build")["model.safetensors"], "README.md": derivative_card(f"org/other@{pinned}", None)})
    plain = _write(tmp_path / "plain", base)
    for folder in (ft, named, plain):
        _score(folder, calib_v0, state)
    capsys.readouterr()
    assert main(["checkpoints", "--state", str(state), "--json"]) == 0
    rows = {r["repo"]: r for r in json.loads(capsys.readouterr().out)["items"]}
    assert set(rows) == {BASE, str(ft.resolve()), str(named.resolve())}   # the plain folder: no row, as before
    got = rows[str(ft.resolve())]
    assert (got["status"], got["base"]["repo"], got["base"]["sha"], got["base"]["relation"],
            got["base"]["relation_source"]) == ("scored", BASE, main_sha, "finetune", "declared")
    assert got["base"]["checkpoint_id"] == rows[BASE]["id"]
    other = rows[str(named.resolve())]["base"]
    assert (other["repo"], other["sha"], other["relation"], other["relation_source"]) == \
        ("org/other", pinned, "finetune", "inferred")
    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        runs = store.query("SELECT model_repo, checkpoint_id FROM score_runs ORDER BY finished_at")
        assert [(r["model_repo"], r["checkpoint_id"]) for r in runs] == [
            (str(ft.resolve()), got["id"]), (str(named.resolve()), rows[str(named.resolve())]["id"]),
            (str(plain.resolve()), None)]
    # The table shows it too, in its base column.
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["checkpoints", "--state", str(state)]) == 0
    assert f"finetune of {BASE}@{main_sha[:12]}" in capsys.readouterr().out


def test_a_hostile_or_unpinnable_card_is_recorded_with_its_problem_not_a_crash(tmp_path, calib_v0, capsys) -> None:
    from monitor.demo.hub_repos import derivative_card, tiny_model_files

    state = tmp_path / "state"
    base = tiny_model_files(TOKENIZER, build_dir=tmp_path / "build")
    bomb = b"---\na: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n" \
           b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c]\n" \
           b"e: [*d, *d, *d, *d, *d, *d, *d, *d]\nbase_model: org/x\n---\n"
    _score(_write(tmp_path / "bomb", {**base, "README.md": bomb}), calib_v0, state)
    _score(_write(tmp_path / "unpinned", {**base, "README.md": derivative_card("org/nowhere", "adapter")}), calib_v0, state)
    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        rows = {Path(r.repo).name: store.checkpoint_base(r.id) for r in store.list_checkpoints()}
    assert set(rows) == {"unpinned"}   # the bomb's card gives no metadata, so no base
    assert rows["unpinned"]["base_sha"] is None and "not pinned" in rows["unpinned"]["problem"]
    assert rows["unpinned"]["relation"] == "adapter"


def test_policy_check_warns_when_residual_derivatives_have_fewer_than_two_labelled_pairs(tmp_path, capsys) -> None:
    from test_derivatives import add_checkpoint, label, write_policy

    from monitor.cli import main
    from support.scores import fake_sha

    path = write_policy(tmp_path / "policies")
    state = tmp_path / "state"

    def warnings() -> list[str]:
        capsys.readouterr()
        assert main(["policy", "check", str(path), "--state", str(state)]) == 0   # valid: a warning, not a refusal
        out = capsys.readouterr().out
        assert out.startswith(f"SUCCESS {path}")
        return [line for line in out.splitlines() if line.startswith("WARNING")]

    # No state folder yet: zero pairs, said with the reason; only the residual task is named.
    [line] = warnings()
    assert "tasks[1] by-residual: derivatives: residual needs at least 2 labelled base/derivative pairs" in line
    assert f"found: no database at {state / 'lstar.duckdb'}" in line and "derivatives: base" in line
    state.mkdir()
    with Store.open(state / "lstar.duckdb") as store:
        base = fake_sha("b1")
        add_checkpoint(store, "up/b1", base, rule=None)
        one, two, adapter = fake_sha("d1"), fake_sha("d2"), fake_sha("d3")
        add_checkpoint(store, "org/d1", one, base=("up/b1", base))
        add_checkpoint(store, "org/d3", adapter, base=("up/b1", base), relation="adapter")
        add_checkpoint(store, "org/d2", two, base=("up/b1", base))
        label(store, "org/d1", one, 0.7)
        label(store, "org/d1", one, 0.71)   # relabelled: still one pair
        label(store, "org/d3", adapter, 0.6)
        # The same counts as the pairs the residual mode reads (monitor.alerts.derivatives).
        assert store.labelled_pair_counts("cloze", "acc") == {
            relation: len(store.labelled_derivatives(relation, "cloze", "acc")) for relation in ("finetune", "adapter")}
    [line] = warnings()
    assert "(found: 1 adapter, 1 finetune)" in line
    with Store.open(state / "lstar.duckdb") as store:
        label(store, "org/d2", two, 0.65)
    assert warnings() == []     # two labelled fine-tunes: residual can judge fine-tunes
