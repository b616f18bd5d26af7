"""The lab record reader (`monitor.lab.records`) on synthetic lab records: bad input is refused
with one clear line naming the file and key, and `lstar lab report` on such a record fails in
one line and writes nothing. (The race between axes is tested in tests/test_lab_race.py.)"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.errors import LabError
from monitor.lab.record_file import load_lab
from monitor.lab.records import LabRecord

# family -> (unigram CE in nats/token, tokens per byte, learning speed)
FAMILIES = {"gpt2": (7.2, 0.30, 1.0), "llama-3": (8.1, 0.26, 1.3), "bert-base-uncased": (6.3, 0.36, 0.8),
            "unigram-toy": (4.0, 0.95, 0.6)}


def synthetic_lab(*, driver: str = "lstar", families: dict[str, tuple[float, float, float]] = FAMILIES,
                  seeds: int = 2, steps: int = 10, n_items: int = 300, seed: int = 0) -> dict[str, Any]:
    """A lab.json whose task accuracy is a logistic rise in `driver` ("lstar" or
    "bpb_minus_unigram") of a latent progress shared by every family."""
    rng = np.random.default_rng(seed)
    checkpoints = []
    for name, (ce_uni, tpb, speed) in families.items():
        for s in range(seeds):
            for k in range(steps):
                step = 100 * (k + 1)
                bytes_seen = 40_000 * step
                u = 1.0 - math.exp(-speed * bytes_seen / 1.2e7) + rng.normal(0, 0.01)
                lstar = 0.3 - 2.0 * u
                ce = lstar + ce_uni
                bpb, ubpb = ce * tpb / math.log(2), ce_uni * tpb / math.log(2)
                drive = lstar if driver == "lstar" else (bpb - ubpb)
                mid = -0.8 if driver == "lstar" else -0.8 * 0.3 / math.log(2)
                scale = 0.12 if driver == "lstar" else 0.12 * 0.3 / math.log(2)
                p = 0.25 + 0.6 / (1.0 + math.exp((drive - mid) / scale))
                acc = rng.binomial(n_items, p) / n_items
                prob = float(np.clip(p + rng.normal(0, 0.01), 0, 1))
                checkpoints.append({
                    "family": name, "seed": s, "step": step, "bytes_seen": bytes_seen,
                    "tokens_seen": int(bytes_seen * tpb), "path": f"{name}-s{s}/step{step}",
                    "metrics": {"ce": ce, "ce_uni": ce_uni, "lstar": lstar, "lstar_se": 0.01,
                                "l_rel": ce / ce_uni, "l_gain": (ce_uni - ce) / ce_uni, "bits_per_byte": bpb,
                                "unigram_bits_per_byte": ubpb, "bpb_minus_unigram": bpb - ubpb},
                    "tasks": {"add-words": {"acc": acc, "prob_correct": prob, "brier": (1 - prob) ** 2,
                                            "n": n_items, "baseline": 0.25}}})
    return {"schema": "lstar-lab/1", "config": {"seeds": seeds, "driver": driver},
            "families": [{"family": f, "tokenizer": f, "tokenizer_fingerprint": f"fp-{f}", "vocab_used": 1000}
                         for f in families],
            "checkpoints": checkpoints}


# -- the reader ---------------------------------------------------------------------------------
def _write(tmp: Path, data: Any) -> Path:
    path = tmp / "lab.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["checkpoints"][3].update(extra=1), "unknown key 'checkpoints.3.extra'"),
    (lambda d: d["checkpoints"][0]["metrics"].update(lstar=float("nan")), "checkpoints.0.metrics.lstar"),
    (lambda d: d["checkpoints"][0].update(family="qwen2"), "checkpoints[0] has family 'qwen2'"),
    (lambda d: d["checkpoints"][1].update(step=100), "seed 0 step 100 is listed more than once"),
    (lambda d: d["checkpoints"][0]["tasks"]["add-words"].update(acc=1.5), "checkpoints.0.tasks.add-words.acc"),
    (lambda d: d.update(schema="lstar-lab/9"), "schema 'lstar-lab/9', expected 'lstar-lab/2' (or 'lstar-lab/1')"),
])
def test_bad_lab_json_is_one_clear_line(tmp_path: Path, mutate: Any, expected: str) -> None:
    data = synthetic_lab(seeds=1, steps=3)
    mutate(data)
    path = _write(tmp_path, json.dumps(data))
    with pytest.raises(LabError) as info:
        load_lab(path)
    line = info.value.one_line()
    assert str(path) in line and expected in line and "\n" not in line


def test_lab_json_that_is_not_a_file_or_not_json(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="no lab record at"):
        load_lab(tmp_path / "missing.json")
    with pytest.raises(LabError, match="not valid JSON"):
        load_lab(_write(tmp_path, "{" * 10))
    (tmp_path / "folder" / "lab.json").mkdir(parents=True)
    with pytest.raises(LabError, match="is a directory, not a lab.json"):
        load_lab(tmp_path / "folder")


# -- hostile numbers ----------------------------------------------------------------------------
def _every_metric(value: float) -> Any:
    def mutate(d: dict[str, Any]) -> None:
        for c in d["checkpoints"]:
            c["metrics"] = {k: abs(value) if k == "lstar_se" else value for k in c["metrics"]}
    return mutate


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["checkpoints"][0].update(bytes_seen=10**400), "checkpoints.0.bytes_seen"),
    (lambda d: d["checkpoints"][2].update(tokens_seen=10**18), "checkpoints.2.tokens_seen"),
    (lambda d: d["checkpoints"][1].update(step=-1), "checkpoints.1.step"),
    (lambda d: d["checkpoints"][1].update(seed=-3), "checkpoints.1.seed"),
    (lambda d: d["checkpoints"][0]["tasks"]["add-words"].update(n=10**400), "checkpoints.0.tasks.add-words.n"),
    (lambda d: d["families"][0].update(vocab_used=-1), "families.0.vocab_used"),
    (_every_metric(1e308), "checkpoints.0.metrics.ce"),
    (_every_metric(-2e6), "checkpoints.0.metrics.ce"),
    (lambda d: d["checkpoints"][0]["metrics"].update(lstar_se=1e7), "checkpoints.0.metrics.lstar_se"),
    (lambda d: d["checkpoints"][0]["tasks"]["add-words"].update(brier=float("inf")),
     "checkpoints.0.tasks.add-words.brier"),
])
def test_lab_report_refuses_numbers_out_of_bounds_in_one_line(tmp_path: Path, capsys: Any, mutate: Any,
                                                               expected: str) -> None:
    """`lstar lab report` on hostile numbers: one line naming the file and the field, exit code
    non-zero, nothing written."""
    from monitor.cli import main

    data = synthetic_lab(seeds=1, steps=3)
    mutate(data)
    path = _write(tmp_path, json.dumps(data))        # 10**400 and inf are written as JSON reads them
    out = tmp_path / "report"
    code = main(["lab", "report", "--lab", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert str(path) in err and expected in err and "Traceback" not in err
    assert not out.exists()


