"""The gate and the pinned, verified download, against the fake Hub's special repos.

The hostile repos are live (their pickle and remote code would create canary files); the
tests prove they are refused before any weight byte or code file is fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import ESCAPING_NAMES, populate_standard
from monitor.errors import GateRefusedError, HubError, IntegrityError
from monitor.hub.client import HubClient, RetryPolicy
from monitor.hub.fetch import fetch_pinned, snapshot_dir, verify_snapshot
from monitor.hub.gate import ExpectedFile, gate_checkpoint, gate_pending, unsafe_name_reason
from monitor.hub.poll import poll_once
from monitor.hub.rules import WatchRule
from monitor.store import Store

RULES = [WatchRule(name="all", author="fake-org"),
         WatchRule(name="steps", author="fake-org", name_glob="pythia-*",
                   revisions={"branches": r"step\d+"})]


@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    """The fake Hub with every special repo (models built once per session)."""
    build = tmp_path_factory.getbasetemp() / "hub-build"
    canaries = tmp_path_factory.mktemp("canaries")
    with FakeHub() as hub:
        info = populate_standard(hub, build, canaries)
        yield hub, info


@pytest.fixture(autouse=True)
def hf_env(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "hf" / "hub"


def client(hub: FakeHub, store: Store | None = None, token: str | bool = False) -> HubClient:
    return HubClient(hub.url, token=token, store=store, policy=RetryPolicy(attempts=1))


def no_canary(info) -> None:
    for path in info["canaries"]:
        assert not os.path.exists(path), f"canary {path} appeared"


# -- the gate ------------------------------------------------------------------------------------
def test_every_special_repo_ends_in_the_expected_status(standard, tmp_path, cache):
    hub, info = standard
    with Store.open(tmp_path / "state.duckdb") as store:
        c = client(hub, store)
        assert all(r.error is None for r in poll_once(store, c, RULES))
        outcomes = gate_pending(store, c, RULES, cache_dir=cache)
        assert outcomes and not [o for o in outcomes if o.status == "discovered"]
        found = {(r.repo, r.sha): r for r in store.list_checkpoints()}

    listed = {repo: spec for repo, spec in info["repos"].items() if spec["listed"]}
    expected_pairs = {(repo, sha) for repo, spec in listed.items() for sha in spec["refs"].values()}
    assert set(found) == expected_pairs                       # the private repo is never listed
    for repo, spec in listed.items():
        for ref, sha in spec["refs"].items():
            row = found[(repo, sha)]
            if spec["expect"] == "ok":
                assert row.status == "gated" and row.reason is None, (repo, row.reason)
            else:
                assert row.status == "skipped", (repo, row.status, row.reason)
                assert spec["reason"] in row.reason.lower(), (repo, row.reason)
    lineage = info["lineage"]
    refs_by_sha = {sha: r.refs for (repo, sha), r in found.items() if repo == lineage}
    assert refs_by_sha[info["repos"][lineage]["refs"]["step3000"]] == ["main", "step3000"]
    # The gate records the date of the very commit it inspected (reports order lineages by it).
    commits = hub.repo(lineage).commits
    dates = {sha: found[(lineage, sha)].meta["gate"]["commit_date"] for sha in refs_by_sha}
    assert dates == {sha: commits[sha].date.isoformat() for sha in refs_by_sha}
    assert len(set(dates.values())) == len(dates) == 3      # one date per step, not the repo's

    gate = found[(f"{info['author']}/tiny-llama", info["repos"][f"{info['author']}/tiny-llama"]["refs"]["main"])]
    facts = gate.meta["gate"]
    config = hub.files(f"{info['author']}/tiny-llama")["config.json"]
    assert facts["model_type"] == "llama" and facts["vocab_size"] == json.loads(config)["vocab_size"]
    assert facts["n_params"] > 0 and facts["n_bytes"] >= facts["n_params"] * 4   # float32 weights

    no_canary(info)
    downloaded = {p.name for p in cache.rglob("*") if p.is_file() or p.is_symlink()}
    assert not [n for n in downloaded if n.endswith((".py", ".bin", ".safetensors"))], downloaded
    for name in ESCAPING_NAMES:
        assert not (cache / "models--fake-org--path-escape" / "snapshots" / "x" / name).exists()
    assert not list(tmp_path.parent.rglob("escape.txt")) and not os.path.exists("/etc/evil")


def test_private_gated_and_missing_repos_are_skipped_with_the_hubs_reason(standard, cache):
    hub, info = standard
    author = info["author"]
    anonymous = client(hub)
    private_sha = info["repos"][f"{author}/private-model"]["refs"]["main"]
    verdict = gate_checkpoint(anonymous, f"{author}/private-model", private_sha, cache_dir=cache)
    assert verdict.status == "skipped" and verdict.reason.startswith("not found or private:")
    gated_sha = info["repos"][f"{author}/gated-model"]["refs"]["main"]
    stranger = gate_checkpoint(client(hub, token=info["tokens"]["stranger"]), f"{author}/gated-model",
                               gated_sha, cache_dir=cache)
    assert stranger.status == "skipped" and "not in the authorized list" in stranger.reason
    approved = gate_checkpoint(client(hub, token=info["tokens"]["approved"]), f"{author}/gated-model",
                               gated_sha, cache_dir=cache)
    assert approved.status == "gated"
    gone = gate_checkpoint(anonymous, f"{author}/tiny-llama", "0" * 40, cache_dir=cache)
    assert gone.status == "skipped" and gone.reason.startswith("revision not found")


def test_rule_budgets_and_parameter_range_apply(standard, cache):
    hub, info = standard
    repo = f"{info['author']}/tiny-llama"
    sha = info["repos"][repo]["refs"]["main"]
    c = client(hub)
    small = WatchRule(name="small", author="fake-org", budgets={"max_params": 1000})
    verdict = gate_checkpoint(c, repo, sha, rule=small, cache_dir=cache)
    assert verdict.status == "skipped" and "max_params 1,000" in verdict.reason
    short = WatchRule(name="short", author="fake-org", budgets={"max_context": 16})
    assert "max_context 16" in gate_checkpoint(c, repo, sha, rule=short, cache_dir=cache).reason
    ranged = WatchRule(name="big-only", author="fake-org", min_params=10**9)
    assert "outside rule 'big-only'" in gate_checkpoint(c, repo, sha, rule=ranged, cache_dir=cache).reason


def _variant(files: dict, case: str) -> dict:
    from monitor.demo.hub_repos import header_only_safetensors, shard_safetensors

    config = json.loads(files["config.json"])
    if case == "missing-shard":
        shards = shard_safetensors(files.pop("model.safetensors"), 2)
        shards.pop("model-00002-of-00002.safetensors")
        return {**files, **shards}
    if case == "no-tensor-data":
        return {**files, "model.safetensors": header_only_safetensors({"w": ("F32", (64, 64))})}
    if case == "overlapping-tensors":
        header = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                             "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}).encode()
        return {**files, "model.safetensors": struct.pack("<Q", len(header)) + header + bytes(24)}
    if case == "truncated":           # a download cut short: the last tensor lacks 10 bytes
        return {**files, "model.safetensors": files["model.safetensors"][:-10]}
    if case == "padded":              # 16 bytes appended after the last tensor
        return {**files, "model.safetensors": files["model.safetensors"] + bytes(16)}
    if case == "million-layers":
        config["num_hidden_layers"] = 10**6
    if case == "claims-more-than-weights":   # every field under its budget, but not these weights
        config.update(hidden_size=4096, intermediate_size=11008, num_attention_heads=32)
    if case == "layers-not-int":
        config["num_hidden_layers"] = True
    if case == "unknown-type":
        config["model_type"] = "mystery"
    if case == "nested-vocab":
        config["text_config"] = {"vocab_size": 10**9}
        del config["vocab_size"]
    if case == "vocab-not-int":
        config["vocab_size"] = "50k"
    return {**files, "config.json": json.dumps(config).encode()}


@pytest.mark.parametrize("case, reason", [
    ("missing-shard", "names shards not in the repo: model-00002-of-00002.safetensors"),
    ("no-tensor-data", "truncated: the header and tensors need 16,488 bytes but the file has 104"),
    ("truncated", "model.safetensors is truncated: the header and tensors need"),
    ("padded", "model.safetensors is padded: the file has"),
    ("million-layers", "over budget: config.json num_hidden_layers 1,000,000 > max_layers 1,024"),
    ("claims-more-than-weights", "implies about 315,752,448 parameters (num_hidden_layers 2, hidden_size "
                                 "4,096, intermediate_size 11,008, vocab_size 32,000) but the safetensors "
                                 "weights hold 1,028,688"),
    ("layers-not-int", "num_hidden_layers = True is not a positive integer"),
    ("overlapping-tensors", "tensor data overlaps at byte 8"),
    ("unknown-type", "unknown model_type 'mystery'"),
    ("nested-vocab", "vocab_size 1,000,000,000 > max_vocab"),
    ("vocab-not-int", "vocab_size = '50k' is not a positive integer")])
def test_inconsistent_repos_are_refused_with_the_reason(standard, cache, case, reason):
    hub, info = standard
    files = hub.files(f"{info['author']}/tiny-llama")
    sha = hub.add_repo(f"extra-org/{case}", _variant(dict(files), case))
    verdict = gate_checkpoint(client(hub), f"extra-org/{case}", sha, cache_dir=cache)
    assert verdict.status == "skipped" and reason in verdict.reason, verdict.reason


@pytest.mark.parametrize("name, why", [
    ("model.safetensors", None), ("sub/dir/file.json", None), ("..", "parent"),
    ("../x", "parent"), ("a/../../b", "parent"), ("/etc/evil", "absolute"), ("C:/x", "absolute"),
    ("a\\b", "backslash"), ("a//b", "empty"), ("./a", "empty"), ("a\x00b", "control")])
def test_unsafe_names(name, why):
    reason = unsafe_name_reason(name)
    assert (reason is None) if why is None else (why in reason)


# -- the pinned download ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-sharded"])
def test_fetch_pinned_downloads_and_verifies_exactly_the_model_files(standard, cache, name):
    hub, info = standard
    repo = f"{info['author']}/{name}"
    sha = info["repos"][repo]["refs"]["main"]
    path = fetch_pinned(repo, "main", cache_dir=cache, client=client(hub))  # a branch is pinned
    assert path == snapshot_dir(cache, repo, sha)
    served = hub.files(repo, sha)
    wanted = {n for n in served if n.endswith((".safetensors", ".json"))}
    got = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    assert got == wanted and "README.md" not in got
    for name_ in got:
        assert hashlib.sha256((path / name_).read_bytes()).hexdigest() == \
            hashlib.sha256(served[name_]).hexdigest()
        assert (path / name_).resolve().is_relative_to(cache.resolve())
    hub.reset_log()
    assert fetch_pinned(repo, sha, cache_dir=cache, client=client(hub)) == path
    assert not [r for r in hub.requests if "/resolve/" in r.path]           # served from the cache


@pytest.mark.parametrize("repo, message", [("pickle-only", "pickle weights refused"),
                                           ("path-escape", "unsafe file path"),
                                           ("gated-model", "gated")])
def test_fetch_pinned_refuses_what_the_gate_refuses(standard, cache, repo, message):
    hub, info = standard
    repo = f"{info['author']}/{repo}"
    with pytest.raises(GateRefusedError, match=message):
        fetch_pinned(repo, info["repos"][repo]["refs"]["main"], cache_dir=cache, client=client(hub))
    assert not [p for p in cache.rglob("*") if p.name.endswith((".bin", ".safetensors"))]
    no_canary(info)


def test_tampered_download_is_an_integrity_failure(standard, tmp_path, cache):
    hub, info = standard
    repo = f"{info['author']}/pythia-tiny"
    sha = info["repos"][repo]["refs"]["step1000"]
    original = hub.files(repo, sha)["model.safetensors"]
    flipped = bytearray(original)
    flipped[-1] ^= 0xFF
    hub.tamper(repo, "model.safetensors", bytes(flipped), revision=sha)
    try:
        with pytest.raises(IntegrityError, match="sha256"):
            fetch_pinned(repo, sha, cache_dir=cache, client=client(hub))
        assert not (snapshot_dir(cache, repo, sha) / "model.safetensors").exists()   # bad file removed
        hub.tamper(repo, "model.safetensors", bytes(original[:-10]), revision=sha)
        with pytest.raises(IntegrityError):
            fetch_pinned(repo, sha, cache_dir=cache, client=client(hub))
    finally:
        hub.tamper(repo, "model.safetensors", original, revision=sha)
    assert fetch_pinned(repo, sha, cache_dir=cache, client=client(hub)).is_dir()


def test_a_partial_snapshot_is_never_accepted(standard, cache):
    hub, info = standard
    repo = f"{info['author']}/tiny-llama"
    sha = info["repos"][repo]["refs"]["main"]
    path = fetch_pinned(repo, sha, cache_dir=cache, client=client(hub))
    meta = hub.file_meta(repo, "tokenizer.json", sha)
    files = [ExpectedFile("tokenizer.json", meta.size, blob_id=meta.blob_id)]
    assert verify_snapshot(cache, repo, sha, files) == path
    os.unlink(path / "tokenizer.json")
    with pytest.raises(HubError, match="incomplete snapshot"):
        verify_snapshot(cache, repo, sha, files)

    # The gate downloaded config.json, so snapshots/<sha>/ exists but holds only that file.
    # If the tree request is then refused, snapshot_download returns that partial folder
    # without raising (hub-api.md section 2): fetch_pinned must not accept it.
    lineage = info["lineage"]
    step = info["repos"][lineage]["refs"]["step2000"]
    assert gate_checkpoint(client(hub), lineage, step, cache_dir=cache).status == "gated"
    assert [p.name for p in snapshot_dir(cache, lineage, step).iterdir()] == ["config.json"]
    announced = client(hub).model_info(lineage, step, files_metadata=True)
    hub.reset_log()
    hub.fail_next(1, 403, path_prefix=f"/api/models/{lineage}/tree")
    with pytest.raises(HubError, match="missing after the download"):
        fetch_pinned(lineage, step, cache_dir=cache, client=client(hub), info=announced)
    assert [(r.path.split("/")[-2], r.status) for r in hub.requests] == [("tree", 403)]
    healed = fetch_pinned(lineage, step, cache_dir=cache, client=client(hub), info=announced)
    assert (healed / "model.safetensors").is_file()

    (path / "tokenizer.json").unlink(missing_ok=True)
    (path / "tokenizer.json").symlink_to(Path("/etc/hostname"))
    with pytest.raises(IntegrityError, match="outside the cache"):
        verify_snapshot(cache, repo, sha, files)


def test_a_file_the_hub_gives_no_hash_for_is_never_accepted(standard, cache):
    """The gate refuses it; the fetch asks the Hub again and refuses it too, removing the file."""
    hub, info = standard
    repo = f"{info['author']}/tiny-llama"
    sha = info["repos"][repo]["refs"]["main"]
    path = fetch_pinned(repo, sha, cache_dir=cache, client=client(hub))
    size = (path / "tokenizer.json").stat().st_size
    with pytest.raises(IntegrityError, match="neither a sha256 nor a git blob id for tokenizer.json"):
        verify_snapshot(cache, repo, sha, [ExpectedFile("tokenizer.json", size)])
    assert not (path / "tokenizer.json").exists()


def test_a_snapshots_identity_is_the_sha256_of_its_bytes(tmp_path):
    """A small file is checked by its git blob id (a SHA-1, against which collisions can be
    made); its identity for scoring once is the sha256 of its bytes, whatever blob id the Hub
    named. An LFS file's identity is the sha256 the fetch checked."""
    from monitor.hub.fetch import snapshot_digests

    (tmp_path / "config.json").write_bytes(b'{"a": 1}')
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    lfs = ExpectedFile("model.safetensors", 7, sha256=hashlib.sha256(b"weights").hexdigest())
    first = snapshot_digests([lfs, ExpectedFile("config.json", 8, blob_id="1" * 40)], tmp_path)
    same_bytes_other_id = snapshot_digests([lfs, ExpectedFile("config.json", 8, blob_id="2" * 40)], tmp_path)
    assert first == same_bytes_other_id
    expected = hashlib.sha256(json.dumps([["config.json", hashlib.sha256(b'{"a": 1}').hexdigest()]]).encode())
    assert first["files_digest"] == expected.hexdigest()
    (tmp_path / "config.json").write_bytes(b'{"a": 2}')   # other bytes (under any blob id): another identity
    assert snapshot_digests([lfs, ExpectedFile("config.json", 8, blob_id="1" * 40)], tmp_path) != first


# -- byte budgets on every fetched file ---------------------------------------------------------
HUGE = 150_000_000   # never written anywhere: the fake Hub only announces or streams it


def _resolved(hub: FakeHub, name: str) -> list:
    return [r for r in hub.requests if "/resolve/" in r.path and r.path.endswith("/" + name)]


def test_a_file_the_listing_announces_over_its_limit_is_refused_before_download(standard, cache):
    hub, info = standard
    repo = "budget-org/huge-tokenizer-config"
    sha = hub.add_repo(repo, hub.files(f"{info['author']}/tiny-llama"))
    hub.announce_size(repo, "tokenizer_config.json", HUGE)
    hub.reset_log()
    verdict = gate_checkpoint(client(hub), repo, sha, cache_dir=cache)
    assert verdict.status == "skipped"
    assert verdict.reason == "refused: tokenizer_config.json is 150,000,000 bytes (limit 16,777,216)"
    with pytest.raises(GateRefusedError, match=r"tokenizer_config.json is 150,000,000 bytes"):
        fetch_pinned(repo, sha, cache_dir=cache, client=client(hub))
    assert not [r for r in hub.requests if "/resolve/" in r.path]   # not even config.json was read
    assert not snapshot_dir(cache, repo, sha).exists()


@pytest.mark.parametrize("name", ["tokenizer_config.json", "model.safetensors"])
def test_a_server_sending_more_than_it_announced_is_stopped_while_downloading(standard, tmp_path, cache,
                                                                              name):
    from monitor.hub.fetch import fetch_job
    from monitor.hub.queue import process_pending

    hub, info = standard
    repo = f"budget-org/lying-{name.split('.')[0]}"
    hub.add_repo(repo, hub.files(f"{info['author']}/tiny-llama"), pipeline_tag="text-generation")
    announced = hub.file_meta(repo, name).size
    rule = WatchRule(name="budget", author="budget-org", name_glob=f"lying-{name.split('.')[0]}")
    with Store.open(tmp_path / "state.duckdb") as store:
        c = client(hub, store)
        poll_once(store, c, [rule])
        assert [o.status for o in gate_pending(store, c, [rule], cache_dir=cache)] == ["gated"]
        hub.serve_generated(repo, name, HUGE)     # the listing still says `announced` bytes
        results = process_pending(store, lambda job: fetch_job(store, job, owner="w", client=c,
                                                                cache_dir=cache), owner="w")
        row = store.get_checkpoint(results[0].id)
    assert (row.status, row.attempts) == ("failed", 1)
    assert f"{name}: the Hub sent more than the {announced:,} bytes allowed" in row.reason
    # The client stopped at its first chunk past the budget: the server never got far.
    assert 0 < hub.bytes_sent(repo, name) < HUGE // 4
    on_disk = [p for p in cache.rglob("*") if p.is_file() and not p.is_symlink()]
    assert not [p for p in on_disk if p.name.endswith(".incomplete")]
    assert max(p.stat().st_size for p in on_disk) < 16 << 20


@pytest.mark.parametrize("how", ["download", "snapshot", "fetch"])
def test_the_byte_cap_holds_on_the_xet_path_where_progress_cannot_stop_a_transfer(standard, cache, monkeypatch,
                                                                                  how):
    """On the Xet path hf_xet reports progress from its own thread and only prints what the callback
    raises, so the streaming cap cannot stop it: the size on disk is checked once the file lands,
    and what this download wrote is removed. The transfer is the stand-in at `xet_get`, hf_xet's seam."""
    from huggingface_hub import file_download
    from huggingface_hub.utils import tqdm as hf_tqdm

    hub, info = standard
    repo = f"xet-org/oversized-{how}"
    files = hub.files(f"{info['author']}/tiny-llama")
    sha = hub.add_repo(repo, files, pipeline_tag="text-generation")
    hub.serve_xet(repo, "model.safetensors")
    announced = hub.file_meta(repo, "model.safetensors").size
    transfers = []

    def xet_transfer(*, incomplete_path, xet_file_data, expected_size=None, tqdm_class=None, _tqdm_bar=None, **_):
        transfers.append(xet_file_data.file_hash)
        data = files["model.safetensors"] + bytes(1 << 20)        # more than the Hub announced
        Path(incomplete_path).write_bytes(data)
        bar = _tqdm_bar or (tqdm_class or hf_tqdm)(total=expected_size, unit="B")
        try:
            bar.update(len(data))
        except Exception:   # noqa: BLE001 - hf_xet prints the callback's exception and goes on
            pass

    monkeypatch.setattr(file_download, "xet_get", xet_transfer)
    c = client(hub)
    with pytest.raises(IntegrityError, match=rf"[\d,]+ bytes on disk after the download, more than the "
                                             rf"{announced:,} allowed; the files it wrote were removed"):
        if how == "download":
            c.download(repo, "model.safetensors", sha, cache_dir=cache, max_bytes=announced)
        elif how == "snapshot":
            c.snapshot(repo, sha, allow_patterns=["model.safetensors"], cache_dir=cache, max_bytes=announced)
        else:
            fetch_pinned(repo, sha, cache_dir=cache, client=c)
    assert transfers == [hub.file_meta(repo, "model.safetensors").sha256]   # the Xet path was taken
    assert not [p for p in cache.rglob("*") if p.name == "model.safetensors" or
                (p.is_file() and p.stat().st_size > announced)]


def test_the_commit_date_comes_from_the_commit_listing_not_the_revisions_last_modified(standard, cache):
    """Whether the revision endpoint's lastModified is the commit's date is unconfirmed (it may be
    the repo's last change): the gate records the date the commit listing gives for that commit."""
    from datetime import datetime, timezone

    source, info = standard
    files = source.files(f"{info['author']}/tiny-llama")
    first = datetime(2024, 1, 1, tzinfo=timezone.utc)
    with FakeHub(revision_last_modified="repo") as hub:
        old = hub.add_repo("dates/run", files, last_modified=first)
        hub.add_commit("dates/run", {"README.md": b"later\n"}, date=datetime(2024, 6, 1, tzinfo=timezone.utc))
        assert client(hub).model_info("dates/run", old).last_modified != first   # the repo's date here
        hub.reset_log()
        verdict = gate_checkpoint(client(hub), "dates/run", old, cache_dir=cache)
        assert verdict.status == "gated", verdict.reason
        assert verdict.meta["gate"]["commit_date"] == first.isoformat()
        assert hub.count_requests(f"/api/models/dates/run/commits/{old}") == 1
