"""The fake Hub, exercised only through the official client (huggingface_hub 2.4, transformers)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    NotASafetensorsRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    SafetensorsParsingError,
)
from huggingface_hub.utils import get_session
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from monitor.demo import hub_repos
from monitor.demo.fakehub import FakeHub

REPO_ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)


def git_blob_id(data: bytes) -> str:
    """What `git hash-object` prints for `data` (written out here, independent of the server)."""
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def small_weights(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return st_save({"a.weight": rng.standard_normal((3, 4)).astype(np.float32),
                    "b.bias": rng.standard_normal(5).astype(np.float16)})


def small_repo(seed: int = 0) -> dict[str, bytes]:
    return {"config.json": json.dumps({"model_type": "llama", "seed": seed}).encode(),
            "model.safetensors": small_weights(seed), "sub/dir/notes.txt": b"hello\n", "README.md": b"# card\n"}


@pytest.fixture
def hub():
    with FakeHub() as fake:
        yield fake


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.url, token=False)


def listing_requests(hub: FakeHub) -> list:
    return [r for r in hub.requests if r.path == "/api/models"]


# ----------------------------------------------------------------------------- listing

def test_listing_follows_absolute_next_links_until_every_repo_is_returned():
    hub = FakeHub(page_size=7).start()
    try:
        api = HfApi(endpoint=hub.url, token=False)
        ids = hub_repos.add_filler_repos(hub, 20)
        hub.add_repo("other-org/x", small_repo())
        got = [m.id for m in api.list_models(author="filler-org")]
        assert sorted(got) == sorted(ids)
        pages = listing_requests(hub)
        assert len(pages) == 3  # 7 + 7 + 6
        assert "cursor" not in pages[0].query and "cursor" in pages[1].query
        assert pages[1].query["author"] == ["filler-org"]  # the next link carries the original filters
    finally:
        hub.stop()


def test_listing_sorts_by_last_modified_newest_first_and_filters(hub, api):
    times = {"org-a/alpha": T0 + timedelta(hours=3), "org-a/beta": T0 + timedelta(hours=1),
             "org-b/gamma-coder": T0 + timedelta(hours=2), "org-a/delta-coder": T0}
    for repo_id, when in times.items():
        hub.add_repo(repo_id, small_repo(), last_modified=when,
                     pipeline_tag="text-generation" if repo_id != "org-a/beta" else "fill-mask", tags=["custom"])
    newest_first = sorted(times, key=times.get, reverse=True)

    models = list(api.list_models(sort="last_modified", expand=["lastModified", "sha"]))
    assert [m.id for m in models] == newest_first
    assert [m.last_modified for m in models] == [times[r] for r in newest_first]
    assert all(m.sha == hub.resolve(m.id) for m in models)

    assert [m.id for m in api.list_models(author="org-a", sort="last_modified")] == \
        [r for r in newest_first if r.startswith("org-a/")]
    assert sorted(m.id for m in api.list_models(search="coder")) == ["org-a/delta-coder", "org-b/gamma-coder"]
    assert sorted(m.id for m in api.list_models(pipeline_tag="fill-mask")) == ["org-a/beta"]
    assert len(list(api.list_models(filter=["custom", "safetensors"]))) == 4
    assert list(api.list_models(filter="pytorch")) == []
    # As on the live Hub, lastModified and sha come only when asked for (expand or full).
    plain = next(iter(api.list_models(sort="last_modified")))
    assert plain.last_modified is None and plain.sha is None and plain.created_at is not None
    full = next(iter(api.list_models(sort="last_modified", full=True)))
    assert full.sha == hub.resolve(newest_first[0]) and [s.rfilename for s in full.siblings] == sorted(small_repo())


def test_listing_of_50000_repos_serves_the_new_ones_in_one_request(hub, api):
    hub_repos.add_filler_repos(hub, 50_000)
    new = [f"fresh-org/model-{i:02d}" for i in range(20)]
    for i, repo_id in enumerate(new):
        hub.add_repo(repo_id, {"config.json": b"{}"}, last_modified=datetime(2025, 1, 1, tzinfo=timezone.utc)
                     + timedelta(minutes=i), pipeline_tag="text-generation")
    hub.reset_log()
    got = list(api.list_models(pipeline_tag="text-generation", sort="last_modified", limit=20,
                               expand=["lastModified"]))
    assert [m.id for m in got] == new[::-1]
    assert hub.count_requests("/api/models") == 1
    # The next page continues with the newest filler repo (filler i was modified at 2020-01-01 + i minutes).
    page2 = list(api.list_models(pipeline_tag="text-generation", sort="last_modified", limit=40,
                                 expand=["lastModified"]))[20:]
    assert [m.id for m in page2[:2]] == ["filler-org/filler-049999", "filler-org/filler-049998"]
    assert page2[0].last_modified == datetime(2020, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=49_999)


def test_listing_limit_and_unknown_expand(hub, api):
    for i in range(5):
        hub.add_repo(f"o/m{i}", {"config.json": b"{}"}, last_modified=T0 + timedelta(minutes=i))
    assert [m.id for m in api.list_models(sort="last_modified", limit=2)] == ["o/m4", "o/m3"]
    assert len(listing_requests(hub)) == 1
    with pytest.raises(HfHubHTTPError) as err:
        list(api.list_models(expand=["notAField"]))
    assert err.value.response.status_code == 400


# ----------------------------------------------------------------------------- model info, refs, commits, tree

def test_model_info_announces_sizes_blob_ids_lfs_and_parameter_counts(hub, api):
    files = small_repo()
    sha = hub.add_repo("org/m", files, gated="auto")
    info = api.model_info("org/m", files_metadata=True)
    assert info.sha == sha and info.gated == "auto" and info.private is False
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == set(files)
    weights = files["model.safetensors"]
    digest = hashlib.sha256(weights).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{digest}\nsize {len(weights)}\n".encode()
    st = siblings["model.safetensors"]
    assert (st.size, st.lfs.size, st.lfs.sha256, st.lfs.pointer_size) == (len(weights), len(weights), digest,
                                                                           len(pointer))
    assert st.blob_id == git_blob_id(pointer)
    cfg = siblings["config.json"]
    assert (cfg.size, cfg.blob_id, cfg.lfs) == (len(files["config.json"]), git_blob_id(files["config.json"]), None)
    # 3*4 float32 + 5 float16, counted by hand
    assert info.safetensors.parameters == {"F32": 12, "F16": 5} and info.safetensors.total == 17
    assert info.config == {"model_type": "llama"}
    assert [s.size for s in api.model_info("org/m").siblings] == [None] * len(files)  # sizes only with blobs


def test_refs_commits_and_revision_info(hub, api):
    first = hub.add_repo("org/lin", small_repo(0), last_modified=T0)
    second = hub.add_commit("org/lin", {"extra.txt": b"x"}, date=T0 + timedelta(hours=1))
    step = hub.add_commit("org/lin", small_repo(1), branch="step1000", replace=True, date=T0 + timedelta(hours=2))
    hub.add_tag("org/lin", "v1", revision=first)
    pr = hub.add_pull_request("org/lin", {"fix.txt": b"y"})

    refs = api.list_repo_refs("org/lin", include_pull_requests=True)
    assert {(b.name, b.ref, b.target_commit) for b in refs.branches} == {
        ("main", "refs/heads/main", second), ("step1000", "refs/heads/step1000", step)}
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", first)]
    assert refs.converts == [] and [p.ref for p in refs.pull_requests] == [f"refs/pr/{pr}"]
    assert api.list_repo_refs("org/lin").pull_requests is None

    assert [c.commit_id for c in api.list_repo_commits("org/lin")] == [second, first]
    assert api.list_repo_commits("org/lin")[0].created_at == T0 + timedelta(hours=1)
    assert [c.commit_id for c in api.list_repo_commits("org/lin", revision=f"refs/pr/{pr}")][1:] == [second, first]

    assert api.model_info("org/lin", revision="step1000").sha == step
    assert api.model_info("org/lin", revision="v1").sha == first
    assert api.model_info("org/lin", revision=first).sha == first
    assert api.model_info("org/lin", revision="step1000").last_modified == T0 + timedelta(hours=2)
    assert api.model_info("org/lin").last_modified == T0 + timedelta(hours=2)  # the repo moved with step1000
    with pytest.raises(RevisionNotFoundError):
        api.model_info("org/lin", revision="step9999")


def test_commit_listing_paginates(hub, api):
    hub.commits_page_size = 2
    shas = [hub.add_repo("org/h", {"f": b"0"})]
    shas += [hub.add_commit("org/h", {"f": str(i).encode()}) for i in range(1, 5)]
    assert [c.commit_id for c in api.list_repo_commits("org/h")] == shas[::-1]
    assert hub.count_requests("/api/models/org/h/commits") == 3


def test_tree_lists_files_and_directories_recursively_and_by_path(hub, api):
    hub.tree_page_size = 3
    files = {**small_repo(), "sub/top.txt": b"t"}
    sha = hub.add_repo("org/t", files)
    top = {(type(e).__name__, e.path) for e in api.list_repo_tree("org/t")}
    assert top == {("RepoFile", "config.json"), ("RepoFile", "model.safetensors"), ("RepoFile", "README.md"),
                   ("RepoFolder", "sub")}
    everything = list(api.list_repo_tree("org/t", recursive=True, revision=sha))
    assert sorted(e.path for e in everything if type(e).__name__ == "RepoFile") == sorted(files)
    assert {e.path for e in everything if type(e).__name__ == "RepoFolder"} == {"sub", "sub/dir"}
    lfs = next(e for e in everything if e.path == "model.safetensors").lfs
    assert lfs.sha256 == hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert sorted(e.path for e in api.list_repo_tree("org/t", path_in_repo="sub")) == ["sub/dir", "sub/top.txt"]
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree("org/t", path_in_repo="nope"))


# ----------------------------------------------------------------------------- files

def test_download_and_snapshot_are_pinned_and_cached_by_etag(hub, tmp_path):
    files = small_repo()
    sha = hub.add_repo("org/d", files)
    path = hf_hub_download("org/d", "model.safetensors", endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert Path(path).read_bytes() == files["model.safetensors"]
    assert Path(path).parent.name == sha  # snapshots/<X-Repo-Commit>/
    blobs = {p.name for p in (tmp_path / "models--org--d" / "blobs").iterdir()}
    assert blobs == {hashlib.sha256(files["model.safetensors"]).hexdigest()}  # LFS ETag = sha256

    hf_hub_download("org/d", "config.json", endpoint=hub.url, cache_dir=tmp_path, token=False)
    blobs = {p.name for p in (tmp_path / "models--org--d" / "blobs").iterdir()}
    assert git_blob_id(files["config.json"]) in blobs  # small-file ETag = git blob id

    hub.add_commit("org/d", {"config.json": b'{"v": 2}'})  # main moves on; the pinned snapshot must not
    snap = snapshot_download("org/d", revision=sha, endpoint=hub.url, cache_dir=tmp_path / "snap", token=False,
                             allow_patterns=["*.json", "sub/**"])
    got = {p.relative_to(snap).as_posix(): p.read_bytes() for p in Path(snap).rglob("*") if p.is_file()}
    assert got == {"config.json": files["config.json"], "sub/dir/notes.txt": files["sub/dir/notes.txt"]}
    assert hub.count_requests("/api/models/org/d/revision") == 0  # a sha needs no resolution
    # Downloads of a file absent at a revision record it in .no_exist and raise.
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download("org/d", "missing.bin", revision=sha, endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert (tmp_path / "models--org--d" / ".no_exist" / sha / "missing.bin").exists()


def test_safetensors_metadata_reads_only_the_header_with_range(hub, api):
    weights = small_weights()
    hub.add_repo("org/s", {"model.safetensors": weights})
    meta = api.get_safetensors_metadata("org/s")
    assert meta.parameter_count == {"F32": 12, "F16": 5}
    gets = [r for r in hub.requests if r.method == "GET" and r.path.endswith("model.safetensors")]
    assert [(r.headers["range"], r.status) for r in gets] == [("bytes=0-100000", 206)]

    huge = hub_repos.header_only_safetensors({"w": ("BF16", (100_000, 100_000)), "v": ("F32", (7,))})
    assert len(huge) < 300
    hub.add_repo("org/huge", {"model.safetensors": huge})
    assert api.get_safetensors_metadata("org/huge").parameter_count == {"BF16": 10**10, "F32": 7}
    assert api.model_info("org/huge").safetensors.total == 10**10 + 7

    for kind in ("length", "json"):
        hub.add_repo(f"org/bad-{kind}", {"model.safetensors": hub_repos.malformed_safetensors(kind)})
        with pytest.raises(SafetensorsParsingError):
            api.get_safetensors_metadata(f"org/bad-{kind}")
        assert api.model_info(f"org/bad-{kind}").safetensors is None
    hub.add_repo("org/bin", {"pytorch_model.bin": b"\x80\x04N."})
    with pytest.raises(NotASafetensorsRepoError):
        api.get_safetensors_metadata("org/bin")


def test_sharded_safetensors_are_read_shard_by_shard(hub, api):
    weights = small_weights(3)
    hub.add_repo("org/sharded", hub_repos.shard_safetensors(weights, 2))
    assert api.get_safetensors_metadata("org/sharded").parameter_count == {"F32": 12, "F16": 5}
    # Reassembling the shards gives back every tensor of the original file.
    shards = hub.files("org/sharded")
    merged = {k: v for name, data in shards.items() if name.endswith(".safetensors") for k, v in st_load(data).items()}
    original = st_load(weights)
    assert merged.keys() == original.keys() and all(np.array_equal(merged[k], original[k]) for k in original)


def test_range_requests(hub):
    data = bytes(range(50))
    hub.add_repo("org/r", {"blob.txt": data})
    url = f"{hub.url}/org/r/resolve/main/blob.txt"
    session = get_session()
    r = session.get(url, headers={"Range": "bytes=2-5"})
    assert (r.status_code, r.content, r.headers["Content-Range"]) == (206, data[2:6], "bytes 2-5/50")
    assert session.get(url, headers={"Range": "bytes=-3"}).content == data[-3:]
    assert session.get(url, headers={"Range": "bytes=45-"}).content == data[45:]
    assert session.get(url, headers={"Range": "bytes=60-70"}).status_code == 416
    head = session.head(url)
    assert head.headers["Content-Length"] == "50" and head.headers["X-Repo-Commit"] == hub.resolve("org/r")


# ----------------------------------------------------------------------------- access errors

def test_missing_gated_private_and_disabled_repos_map_to_client_errors(hub, api, tmp_path):
    files = small_repo()
    for name in ("gated", "private", "disabled", "open"):
        hub.add_repo(f"org/{name}", files)
    hub.set_gated("org/gated", "manual", approved_tokens=("hf_ok",))
    hub.set_private("org/private", True, member_tokens=("hf_member",))
    hub.set_disabled("org/disabled")

    def download(repo: str, token, filename: str = "config.json") -> str:
        return hf_hub_download(repo, filename, endpoint=hub.url, cache_dir=tmp_path, token=token)

    with pytest.raises(RepositoryNotFoundError) as err:
        api.model_info("org/nope")
    assert not isinstance(err.value, GatedRepoError)
    with pytest.raises(RepositoryNotFoundError):
        download("org/nope", False)
    with pytest.raises(RemoteEntryNotFoundError):
        download("org/open", False, "nope.txt")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("org/open", "config.json", revision="nope", endpoint=hub.url, cache_dir=tmp_path,
                        token=False)

    assert api.model_info("org/gated").gated == "manual"  # metadata stays public
    with pytest.raises(GatedRepoError) as err:
        download("org/gated", False)
    assert err.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as err:
        download("org/gated", "hf_stranger")
    assert err.value.response.status_code == 403
    with pytest.raises(GatedRepoError):
        api.get_safetensors_metadata("org/gated")
    assert Path(download("org/gated", "hf_ok")).read_bytes() == files["config.json"]

    with pytest.raises(RepositoryNotFoundError):
        api.model_info("org/private")
    assert "org/private" not in {m.id for m in api.list_models()}
    assert HfApi(endpoint=hub.url, token="hf_member").model_info("org/private").private is True
    assert "org/private" in {m.id for m in HfApi(endpoint=hub.url, token="hf_member").list_models()}

    with pytest.raises(DisabledRepoError):
        api.model_info("org/disabled")
    # hf_hub_download treats a refused HEAD like a network failure: the cause is kept underneath.
    with pytest.raises(LocalEntryNotFoundError) as err:
        download("org/disabled", False)
    assert isinstance(err.value.__cause__, DisabledRepoError)


# ----------------------------------------------------------------------------- faults

def test_rate_limit_retry_after_is_honoured_by_paginated_calls(hub, api):
    hub.add_repo("org/m", {"config.json": b"{}"})
    hub.fail_next(1, status=429, retry_after=1, path_prefix="/api/models")
    assert [m.id for m in api.list_models()] == ["org/m"]
    first, second = listing_requests(hub)
    assert (first.status, second.status) == (429, 200)
    assert second.time - first.time >= 1.0


def test_non_paginated_calls_surface_429_with_its_headers(hub, api):
    hub.add_repo("org/m", {"config.json": b"{}"})
    hub.fail_next(1, status=429, retry_after=30)
    with pytest.raises(HfHubHTTPError) as err:
        api.model_info("org/m")
    headers = err.value.response.headers
    assert err.value.response.status_code == 429
    assert (headers["Retry-After"], headers["RateLimit"]) == ("30", '"api";r=0;t=30')
    assert api.model_info("org/m").id == "org/m"  # one failure only
    hub.fail_next(2, status=503, path_prefix="/org/m/resolve/")
    session = get_session()
    assert [session.head(f"{hub.url}/org/m/resolve/main/config.json").status_code for _ in range(3)] == [503, 503, 200]


def test_outage_and_restart_on_the_same_port(hub, api):
    hub.add_repo("org/m", {"config.json": b"{}"})
    hub.set_outage(True)
    with pytest.raises(HfHubHTTPError) as err:
        api.model_info("org/m")
    assert err.value.response.status_code == 503
    hub.set_outage(False)
    assert api.model_info("org/m").id == "org/m"
    port = hub.port
    hub.stop()
    with pytest.raises(Exception) as down:
        api.model_info("org/m")
    assert not isinstance(down.value, HfHubHTTPError)  # a connection error, not an HTTP answer
    hub.start()
    assert hub.port == port and api.model_info("org/m").id == "org/m"


def test_cdn_redirect_serves_lfs_from_another_host_without_the_token(hub, tmp_path):
    hub.cdn_redirect = True
    files = small_repo()
    hub.add_repo("org/c", files)
    path = hf_hub_download("org/c", "model.safetensors", endpoint=hub.url, cache_dir=tmp_path, token="hf_secret")
    assert Path(path).read_bytes() == files["model.safetensors"]
    head, get = [r for r in hub.requests if r.path.startswith(("/org/c/", "/cdn/"))]
    assert (head.method, head.status, head.headers["authorization"]) == ("HEAD", 302, "Bearer hf_secret")
    digest = hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert (get.path, get.status, get.headers["host"].split(":")[0]) == (f"/cdn/{digest}", 200, "localhost")
    assert "authorization" not in get.headers
    hf_hub_download("org/c", "config.json", endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert hub.count_requests("/cdn/") == 1  # small files are served directly


def test_tampered_content_keeps_the_announced_metadata(hub, api, tmp_path):
    files = small_repo()
    hub.add_repo("org/t", files)
    original = files["model.safetensors"]
    forged = bytes(len(original) - 1) + b"X"
    hub.tamper("org/t", "model.safetensors", forged)
    path = hf_hub_download("org/t", "model.safetensors", endpoint=hub.url, cache_dir=tmp_path, token=False)
    announced = {s.rfilename: s for s in api.model_info("org/t", files_metadata=True).siblings}["model.safetensors"]
    assert Path(path).read_bytes() == forged
    assert announced.lfs.sha256 == hashlib.sha256(original).hexdigest() != hashlib.sha256(forged).hexdigest()
    hub.tamper("org/t", "config.json", b"{}")  # a different size: the client's own size check fails
    with pytest.raises(OSError, match="Consistency check failed"):
        hf_hub_download("org/t", "config.json", endpoint=hub.url, cache_dir=tmp_path, token=False)


def test_request_log_counts_and_resets(hub, api):
    hub.add_repo("org/m", {"config.json": b"{}"})
    api.model_info("org/m")
    api.list_repo_refs("org/m")
    list(api.list_models())
    assert hub.count_requests("/api/models/org/m") == 2
    assert hub.count_requests("/api/models") == 3
    assert hub.count_requests(method="HEAD") == 0
    assert [r.path for r in hub.requests] == ["/api/models/org/m", "/api/models/org/m/refs", "/api/models"]
    hub.reset_log()
    assert hub.requests == [] and hub.count_requests() == 0


def test_keep_alive_connections_send_without_waiting_for_acks(hub, api):
    """Nagle's algorithm would hold each body behind the client's delayed ACK (~40 ms a request)."""
    import socket

    hub.add_repo("org/m", {"config.json": b"{}"})
    api.model_info("org/m")  # the shared client keeps this connection open
    with hub._server._open_lock:
        sockets = list(hub._server._open)
    assert sockets, "the client's keep-alive connection is not open on the hub"
    assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


def test_injected_clock_dates_commits_and_last_modified():
    now = [T0]
    with FakeHub(clock=lambda: now[0]) as hub:
        api = HfApi(endpoint=hub.url, token=False)
        sha1 = hub.add_repo("org/m", {"config.json": b"{}"})
        now[0] = T0 + timedelta(days=2, milliseconds=250)
        sha2 = hub.add_commit("org/m", {"x.txt": b"x"})
        info = api.model_info("org/m")
        assert (info.sha, info.last_modified, info.created_at) == (sha2, now[0], T0)
        assert [(c.commit_id, c.created_at) for c in api.list_repo_commits("org/m")] == [(sha2, now[0]), (sha1, T0)]


def test_agent_harness_probe_gets_404(hub):
    assert get_session().get(f"{hub.url}/api/agent-harnesses").status_code == 404


@pytest.mark.slow
def test_runs_as_a_process_with_a_scenario_and_control_api(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "monitor.demo.fakehub", "--port", "0", "--scenario",
                             "empty", "--filler", "12", "--workdir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env)
    try:
        ready = json.loads(proc.stdout.readline())
        api = HfApi(endpoint=ready["url"], token=False)
        assert len(list(api.list_models(author="filler-org"))) == 12
        session = get_session()
        session.post(f"{ready['url']}/_fakehub/fail_next", json={"n": 1, "status": 503})
        with pytest.raises(HfHubHTTPError):
            api.model_info("filler-org/filler-000003")
        assert api.model_info("filler-org/filler-000003").sha is not None
        log = session.get(f"{ready['url']}/_fakehub/requests").json()
        assert [(r["path"], r["status"]) for r in log] == [("/api/models", 200),
                                                           ("/api/models/filler-org/filler-000003", 503),
                                                           ("/api/models/filler-org/filler-000003", 200)]
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


# ----------------------------------------------------------------------------- the standard repos

@pytest.fixture(scope="module")
def standard(tmp_path_factory):
    root = tmp_path_factory.mktemp("standard")
    with FakeHub() as hub:
        info = hub_repos.populate_standard(hub, root / "build", root / "canaries")
        yield hub, info, root


def test_hostile_payloads_are_live(tmp_path):
    canary = tmp_path / "pickle_canary"
    pickle.loads(hub_repos.pickle_canary_payload(canary))
    assert canary.exists()
    canary = tmp_path / "remote_canary"
    source = hub_repos.remote_code_files(canary, {"vocab_size": 10})["configuration_evil.py"].decode()
    exec(compile(source.split("from transformers")[0], "configuration_evil.py", "exec"), {})
    assert canary.read_text() == "remote code ran\n"


def test_standard_repos_are_listed_and_described(standard):
    hub, info, _ = standard
    api = HfApi(endpoint=hub.url, token=False)
    listed = {m.id: m for m in api.list_models(author=info["author"], expand=["sha", "safetensors", "gated"])}
    assert set(listed) == {r for r, d in info["repos"].items() if d["listed"]}
    for repo_id, desc in info["repos"].items():
        if desc["listed"]:
            assert listed[repo_id].sha == desc["refs"]["main"]
    assert listed["fake-org/over-budget"].safetensors.total == 2 * 100_000 * 50_000
    assert listed["fake-org/gated-model"].gated == "manual"
    llama = hub.files("fake-org/tiny-llama")["model.safetensors"]
    header = json.loads(llama[8:8 + struct.unpack("<Q", llama[:8])[0]])
    n_params = sum(int(np.prod(t["shape"])) for k, t in header.items() if k != "__metadata__")
    assert listed["fake-org/tiny-llama"].safetensors.total == n_params
    assert listed["fake-org/tiny-llama-sharded"].safetensors.total == n_params
    names = {s.rfilename for s in api.model_info("fake-org/path-escape").siblings}
    assert set(hub_repos.ESCAPING_NAMES) <= names
    absurd = json.loads(hub.files("fake-org/absurd-config")["config.json"])
    assert absurd["vocab_size"] == absurd["max_position_embeddings"] == 10**9
    assert api.model_info("fake-org/remote-code").config["auto_map"]["AutoModelForCausalLM"] == \
        "modeling_evil.EvilForCausalLM"
    refs = {b.name: b.target_commit for b in api.list_repo_refs(info["lineage"]).branches}
    assert refs == info["repos"][info["lineage"]]["refs"] and refs["main"] == refs["step3000"]
    assert len(set(refs.values())) == 3
    steps = [hub.files(info["lineage"], f"step{s}")["model.safetensors"] for s in (1000, 2000, 3000)]
    assert len(set(steps)) == 3  # a different checkpoint on every step branch


@pytest.mark.slow
def test_transformers_loads_a_step_branch_and_refuses_hostile_repos(standard, tmp_path):
    hub, info, _ = standard
    script = textwrap.dedent("""
        import json, sys
        from transformers import AutoModelForCausalLM
        out = {}
        model = AutoModelForCausalLM.from_pretrained("fake-org/pythia-tiny", revision="step1000",
                                                     use_safetensors=True, trust_remote_code=False)
        out["sums"] = {k: float(v.double().sum()) for k, v in model.state_dict().items()}
        for repo, kwargs in (("fake-org/remote-code", {}), ("fake-org/pickle-only", {})):
            try:
                AutoModelForCausalLM.from_pretrained(repo, use_safetensors=True, trust_remote_code=False)
                out[repo] = "loaded"
            except Exception as exc:
                out[repo] = type(exc).__name__
        print(json.dumps(out))
    """)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"),
           "DISABLE_SAFETENSORS_CONVERSION": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    step1000 = info["repos"][info["lineage"]]["refs"]["step1000"]
    fetched = [r.path for r in hub.requests if r.path.startswith("/fake-org/pythia-tiny/resolve/")]
    assert f"/fake-org/pythia-tiny/resolve/{step1000}/model.safetensors" in fetched
    assert all(path.split("/")[4] == step1000 for path in fetched)  # every file read at the pinned sha
    weights = st_load(hub.files(info["lineage"], "step1000")["model.safetensors"])
    renamed = {"embed_out.weight": "lm_head.weight"}  # transformers 5 renames GPT-NeoX's head on load
    assert sorted(out["sums"]) == sorted(renamed.get(name, name) for name in weights)
    for name, array in weights.items():
        expected = float(array.astype(np.float64).sum())
        assert out["sums"][renamed.get(name, name)] == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert out["fake-org/remote-code"] == "ValueError"
    assert out["fake-org/pickle-only"] == "OSError"
    for canary in info["canaries"]:
        assert not Path(canary).exists()
    pins = [r for r in hub.requests if r.path == "/api/models/fake-org/pythia-tiny/revision/step1000"]
    assert len(pins) == 1


def test_help_names_every_built_in_scenario(capsys):
    """`--help` lists the scenarios `--scenario` accepts (docs/guide.md serves `guide`)."""
    from monitor.demo.fakehub import main
    from monitor.demo.hub_repos import SCENARIOS

    with pytest.raises(SystemExit):
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "guide" in SCENARIOS
    for name in SCENARIOS:
        assert name in shown.split("built-in scenario (", 1)[1].split(")", 1)[0], name
