"""`lstar score|eval ORG/REPO@REV --endpoint URL --cache-dir DIR`: the checkpoint comes from the Hub
named on the command line and lands in the cache folder named there, whatever HF_ENDPOINT and
HF_HUB_CACHE say; the repo name never reaches the other Hub.

The scorer is the real CLI in a subprocess (huggingface_hub reads HF_ENDPOINT at import), the
Hubs are two fake Hubs on 127.0.0.1 holding different weights under the same repo name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import tiny_model_files

REPO_ROOT = Path(__file__).resolve().parent.parent
SCORE_FLAGS = ["--max-context", "64", "--docs", "3", "--no-tcb", "--quiet", "--no-db", "--json"]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["score", "eval"])
def test_the_model_comes_from_the_endpoint_flag_into_the_cache_dir_flag(command, tmp_path, calib_v0, shared_dir):
    flags = ({"score": ["--corpus", str(calib_v0), *SCORE_FLAGS],
              "eval": ["--task", str(shared_dir / "tasks" / "cloze-v0.jsonl"), "--limit", "4", "--no-store",
                       "--device", "cpu", "--dtype", "float32", "--json"]}[command])
    with FakeHub() as chosen, FakeHub() as decoy:
        sha = chosen.add_repo("acme/tiny", tiny_model_files("gpt2", arch="llama", seed=3))
        other = decoy.add_repo("acme/tiny", tiny_model_files("gpt2", arch="llama", seed=5))
        assert sha != other
        cache, default_cache = tmp_path / "flag-cache", tmp_path / "env-cache"
        env = {**os.environ, "HF_ENDPOINT": decoy.url, "HF_HUB_CACHE": str(default_cache),
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        env.pop("LSTAR_FAILPOINT", None)
        done = subprocess.run(
            [sys.executable, "-m", "monitor.cli", command, "acme/tiny@main", "--endpoint", chosen.url,
             "--cache-dir", str(cache), *flags],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        if command == "score":
            assert (result["model"]["repo"], result["model"]["sha"], result["model"]["source"]) == (
                "acme/tiny", sha, "hub")
        else:
            assert (result["repo"], result["sha"], result["n_items"]) == ("acme/tiny", sha, 4)
        assert decoy.requests == []                  # not even the repo's name reached HF_ENDPOINT
        assert chosen.count_requests("/api/models/acme/tiny") >= 1
        snapshot = cache / "models--acme--tiny" / "snapshots" / sha
        assert (snapshot / "model.safetensors").is_file() and (snapshot / "config.json").is_file()
        assert not default_cache.exists()


@pytest.mark.parametrize("command", ["score", "eval"])
@pytest.mark.parametrize("flag", ["--endpoint", "--cache-dir"])
def test_the_hub_flags_with_a_local_model_are_refused(command, flag, tmp_path, capsys):
    local = tmp_path / "model"
    local.mkdir()
    value = "http://127.0.0.1:9" if flag == "--endpoint" else str(tmp_path / "cache")
    rest = {"score": ["--corpus", str(tmp_path / "none"), "--no-db"],
            "eval": ["--task", str(tmp_path / "none.jsonl"), "--no-store"]}[command]
    code = main([command, str(local), flag, value, *rest])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: --endpoint and --cache-dir say where a Hub checkpoint comes from; {local} "), err
    assert not (tmp_path / "cache").exists()
