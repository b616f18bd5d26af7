"""Task labels: lm-eval results, CSV, the multiple-choice evaluator, `lstar eval`, store joins."""

from __future__ import annotations

import copy
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from monitor.cli import main
from monitor.curves.evaluator import encode_pair, evaluate_multiple_choice, load_mc_task
from monitor.curves.labels import join_scores, read_labels_csv, read_lm_eval_results, select_labels
from monitor.errors import LabelError
from monitor.store import Store

SHA = "50f5173d932e8e61f858120bcb800b97af589f46"

# A results file as lm-evaluation-harness 0.4.x writes it (EvaluationTracker.save_results_aggregated:
# evaluate()'s results, group_subtasks, configs, versions, n-shot, higher_is_better, n-samples;
# simple_evaluate()'s config, git_hash, date, env and tokenizer info; the tracker's fields).
LM_EVAL_RESULTS = {
    "results": {
        "arc_easy": {"alias": "arc_easy", "acc,none": 0.4364478114478115,
                     "acc_stderr,none": 0.010176569980111046, "acc_norm,none": 0.4006734006734007,
                     "acc_norm_stderr,none": 0.010055304474255573},
        "lambada_openai": {"alias": "lambada_openai", "perplexity,none": 31.98,
                           "perplexity_stderr,none": 1.17, "acc,none": 0.3293227246264312,
                           "acc_stderr,none": 0.006547457950681236},
        "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.0053,
                  "exact_match_stderr,strict-match": 0.002, "exact_match,flexible-extract": 0.0182,
                  "exact_match_stderr,flexible-extract": "N/A"},
    },
    "group_subtasks": {"arc_easy": [], "lambada_openai": [], "gsm8k": []},
    "configs": {"arc_easy": {"task": "arc_easy", "dataset_path": "allenai/ai2_arc",
                             "output_type": "multiple_choice", "num_fewshot": 0,
                             "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}},
    "versions": {"arc_easy": 1.0, "lambada_openai": 1.0, "gsm8k": 3.0},
    "n-shot": {"arc_easy": 0, "lambada_openai": 0, "gsm8k": 5},
    "higher_is_better": {"arc_easy": {"acc": True, "acc_norm": True},
                         "lambada_openai": {"perplexity": False, "acc": True},
                         "gsm8k": {"exact_match": True}},
    "n-samples": {"arc_easy": {"original": 2376, "effective": 2376},
                  "lambada_openai": {"original": 5153, "effective": 5153},
                  "gsm8k": {"original": 1319, "effective": 100}},
    "config": {"model": "hf", "model_args": "pretrained=EleutherAI/pythia-160m,revision=step143000,dtype=float32",
               "model_num_parameters": 162322944, "model_dtype": "torch.float32",
               "model_revision": "step143000", "model_sha": SHA, "batch_size": "16", "batch_sizes": [],
               "device": "cuda:0", "use_cache": None, "limit": None, "bootstrap_iters": 100000,
               "gen_kwargs": None, "random_seed": 0, "numpy_seed": 1234, "torch_seed": 1234,
               "fewshot_seed": 1234},
    "git_hash": "4600d6bf", "date": 1717243200.0, "pretty_env_info": "PyTorch version: 2.3.0",
    "transformers_version": "4.41.2", "lm_eval_version": "0.4.3", "upper_git_hash": None,
    "tokenizer_pad_token": ["<|endoftext|>", "0"], "tokenizer_eos_token": ["<|endoftext|>", "0"],
    "tokenizer_bos_token": ["<|endoftext|>", "0"], "eot_token_id": 0, "max_length": 2048,
    "task_hashes": {}, "model_source": "hf", "model_name": "EleutherAI/pythia-160m",
    "model_name_sanitized": "EleutherAI__pythia-160m", "system_instruction": None,
    "system_instruction_sha": None, "fewshot_as_multiturn": False, "chat_template": None,
    "chat_template_sha": None, "start_time": 1234.5, "end_time": 1534.5,
    "total_evaluation_time_seconds": "300.0",
}


def write_results(folder: Path, data: dict, stamp: str = "2024-06-01T12-00-00.000000") -> Path:
    out = folder / data["model_name_sanitized"] / f"results_{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return out


# -- lm-eval import ------------------------------------------------------------------------------
def test_lm_eval_results_file_becomes_labels(tmp_path):
    path = write_results(tmp_path, LM_EVAL_RESULTS)
    labels = read_lm_eval_results(path)
    by_key = {(l.task, l.metric): l for l in labels}
    assert set(by_key) == {("arc_easy", "acc"), ("arc_easy", "acc_norm"), ("lambada_openai", "perplexity"),
                           ("lambada_openai", "acc"), ("gsm8k", "exact_match,strict-match"),
                           ("gsm8k", "exact_match,flexible-extract")}
    acc = by_key[("arc_easy", "acc_norm")]
    assert acc.value == 0.4006734006734007 and acc.stderr == 0.010055304474255573 and acc.n == 2376
    assert acc.checkpoint == "EleutherAI/pythia-160m@step143000"
    assert acc.repo == "EleutherAI/pythia-160m" and acc.sha == SHA and acc.family == "EleutherAI/pythia-160m"
    assert acc.params == 162322944.0 and acc.source == "lm-eval" and acc.details["revision"] == "step143000"
    assert by_key[("gsm8k", "exact_match,flexible-extract")].stderr is None      # "N/A"
    assert by_key[("gsm8k", "exact_match,strict-match")].n == 100               # effective, after --limit
    # A folder is searched recursively, as lm-eval nests results under the model's name.
    assert len(read_lm_eval_results(tmp_path, family="pythia")) == len(labels)
    assert {l.family for l in read_lm_eval_results(tmp_path, family="pythia")} == {"pythia"}


def test_lm_eval_model_args_as_dict_and_missing_sha(tmp_path):
    data = copy.deepcopy(LM_EVAL_RESULTS)
    del data["model_name"]
    data["config"]["model_args"] = {"pretrained": "org/m", "revision": "main"}
    data["config"]["model_sha"] = ""
    data["config"]["model_revision"] = "main"
    labels = read_lm_eval_results(write_results(tmp_path, data))
    assert {l.checkpoint for l in labels} == {"org/m"} and all(l.sha is None for l in labels)


def test_select_labels_errors_name_what_is_available(tmp_path):
    labels = read_lm_eval_results(write_results(tmp_path, LM_EVAL_RESULTS))
    rows, metric = select_labels(labels, task="lambada_openai", metric="acc")
    assert metric == "acc" and [r.value for r in rows] == [0.3293227246264312]
    with pytest.raises(LabelError, match="unknown task 'hellaswag'.*arc_easy, gsm8k, lambada_openai"):
        select_labels(labels, task="hellaswag", metric="acc")
    with pytest.raises(LabelError, match="unknown metric 'f1'.*acc, acc_norm"):
        select_labels(labels, task="arc_easy", metric="f1")
    with pytest.raises(LabelError, match="several metrics"):
        select_labels(labels, task="arc_easy", metric=None)


def test_bad_results_files(tmp_path):
    with pytest.raises(LabelError, match="no results_"):
        read_lm_eval_results(tmp_path)
    bad = tmp_path / "results_x.json"
    bad.write_text("{not json")
    with pytest.raises(LabelError, match="not a JSON results file"):
        read_lm_eval_results(bad)
    bad.write_text(json.dumps({"config": {}}))
    with pytest.raises(LabelError, match="no 'results' object"):
        read_lm_eval_results(bad)


# -- CSV -------------------------------------------------------------------------------------------
def test_csv_labels_and_their_errors(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text("checkpoint,family,lstar,lstar_se,raw_ce,value,n,params\n"
                    "a-1,a,-2.5,0.01,4.1,0.31,300,1e8\n"
                    "a-2,a,-3.0,,3.6,0.52,,2e8\n", encoding="utf-8")
    with pytest.raises(LabelError, match=r"labels.csv:3: row has neither n nor stderr"):
        read_labels_csv(path)
    path.write_text("checkpoint,family,lstar,lstar_se,raw_ce,value,n,params,stderr\n"
                    "a-1,a,-2.5,0.01,4.1,0.31,300,1e8,\n"
                    "a-2,a,-3.0,,3.6,0.52,,2e8,0.02\n", encoding="utf-8")
    labels = read_labels_csv(path)
    assert [l.checkpoint for l in labels] == ["a-1", "a-2"]
    assert labels[0].n == 300 and labels[0].params == 1e8 and labels[0].stderr is None
    assert labels[1].lstar_se is None and labels[1].stderr == 0.02 and labels[1].n is None
    for body, message in (
        ("checkpoint,lstar,value,n\n", "lacks column.*family"),
        ("checkpoint,family,value,n\nx,a,0.3,300\n", "no axis column"),
        ("checkpoint,family,params,log_params,value,n\n", "both 'params' and 'log_params'"),
        ("checkpoint,family,lstar,lstar_se,raw_ce,value,n,colour\n", "unknown column.*colour"),
        ("checkpoint,family,lstar,lstar_se,raw_ce,value,n\nx,a,-2,0.1,4,nan,300\n",
         r":2: column 'value' is 'nan' \(not a finite number\)"),
        ("checkpoint,family,lstar,lstar_se,raw_ce,value,n\nx,a,-2,0.1,4,abc,300\n",
         r":2: column 'value': 'abc' is not a number"),
        ("checkpoint,family,lstar,lstar_se,raw_ce,value,n\nx,a,-2,x,4,0.3,300\n", r":2: column 'lstar_se': 'x'"),
        ("checkpoint,family,lstar,lstar_se,raw_ce,value,n\nx,a,-2,0.1,4,0.3,2.5\n", "not a positive whole number"),
        ("checkpoint,family,lstar,lstar_se,raw_ce,value,n\n", "no rows"),
    ):
        path.write_text(body, encoding="utf-8")
        with pytest.raises(LabelError, match=message):
            read_labels_csv(path)


# -- the multiple-choice evaluator ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, shared_dir):
    from monitor.lab.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "gpt2-tiny", shared_dir / "tokenizers" / "gpt2",
                            arch="llama", seed=3, hidden=16, layers=2, heads=2, max_positions=256)


@pytest.fixture(scope="module")
def cloze(shared_dir):
    return load_mc_task(shared_dir / "tasks" / "cloze-v0.jsonl", limit=8)


def naive_option_loglik(model, prefix: int, ctx: list[int], cont: list[int]) -> float:
    """One forward pass per option in float64, summing the continuation's log-probabilities.
    The model answers every position's logits; only the rows that predict the continuation are
    log-softmaxed (the softmax is per row: the same numbers as over all rows, which cost most of
    this loop's time over gpt2's 50,257 ids)."""
    import torch

    ids = torch.tensor([[prefix] + ctx + cont])
    start = 1 + len(ctx)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
        logp = torch.log_softmax(logits[start - 1:start - 1 + len(cont)].double(), dim=-1)
    return sum(float(logp[j, cont[j]]) for j in range(len(cont)))


def test_cloze_task_loads_with_its_pin(cloze, shared_dir):
    full = load_mc_task(shared_dir / "tasks" / "cloze-v0.jsonl")
    assert len(full.items) == 300 and full.name == "cloze-v0"
    assert full.sha256 == "0a133cfc32319b93ff825496b1c37cf079fd7edd2e1d9cfcc024d362144e4c91"
    assert len(cloze.items) == 8 and all(len(it.choices) == 4 for it in cloze.items)


@pytest.mark.slow
def test_mc_evaluator_equals_a_naive_per_option_loop(tiny_model_dir, cloze):
    import torch
    from transformers import AutoModelForCausalLM

    from monitor.scoring.tokenizer import load_tokenizer

    handle = load_tokenizer(tiny_model_dir)
    tok = handle.tokenizer
    prefix = handle.prefix_token_id
    assert prefix == 50256                       # gpt2: BOS = <|endoftext|>
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float64)
    model.eval()

    naive = []
    for item in cloze.items:
        ctx = tok.encode(item.context, add_special_tokens=False).ids
        row = []
        for choice in item.choices:
            cont = tok.encode(choice, add_special_tokens=False).ids
            # On these items the lm-eval split equals encoding the option on its own.
            assert encode_pair(tok, item.context, choice) == (ctx, cont)
            row.append(naive_option_loglik(model, prefix, ctx, cont))
        naive.append(np.array(row))

    result = evaluate_multiple_choice(model, tok, cloze, prefix_token_id=prefix, batch_size=5)
    for ours, ref in zip(result.loglikelihoods, naive):
        np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-10)

    # Metrics by hand from the naive log-likelihoods.
    answers = [it.answer for it in cloze.items]
    lengths = [np.array([len(c) for c in it.choices], float) for it in cloze.items]
    acc = np.mean([np.argmax(ll) == a for ll, a in zip(naive, answers)])
    acc_norm = np.mean([np.argmax(ll / ln) == a for ll, ln, a in zip(naive, lengths, answers)])
    probs = [np.exp(ll / ln) / np.sum(np.exp(ll / ln)) for ll, ln in zip(naive, lengths)]
    prob = np.array([p[a] for p, a in zip(probs, answers)])
    brier = np.array([sum((p[k] - (k == a)) ** 2 for k in range(4)) for p, a in zip(probs, answers)])
    n = len(answers)
    assert result.metrics["acc"] == pytest.approx((acc, math.sqrt(acc * (1 - acc) / n)))
    assert result.metrics["acc_norm"] == pytest.approx((acc_norm, math.sqrt(acc_norm * (1 - acc_norm) / n)))
    assert result.metrics["prob_correct"] == pytest.approx((prob.mean(), prob.std(ddof=1) / math.sqrt(n)))
    assert result.metrics["brier"] == pytest.approx((brier.mean(), brier.std(ddof=1) / math.sqrt(n)))
    assert result.baselines["acc"] == 0.25 and result.baselines["brier"] == 0.75

    # In float32 with another batch size it agrees with the float64 reference to float32 precision.
    r32 = evaluate_multiple_choice(model.float(), tok, cloze, prefix_token_id=prefix, batch_size=16)
    for ours, ref in zip(r32.loglikelihoods, naive):
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-3)


def test_encode_pair_moves_trailing_space_as_lm_eval_does(shared_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(shared_dir / "tokenizers" / "gpt2" / "tokenizer.json"))
    ctx, cont = encode_pair(tok, "The cat sat on the ", "mat")
    assert ctx == tok.encode("The cat sat on the", add_special_tokens=False).ids
    assert cont == tok.encode(" mat", add_special_tokens=False).ids


def test_task_file_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    for body, message in (
        ('{"id": "a", "context": "x", "choices": [" a", " b"], "answer": 2}\n', "'answer' must index"),
        ('{"id": "a", "context": "x", "choices": [" a"], "answer": 0}\n', "at least 2"),
        ('{"id": "a", "choices": [" a", " b"], "answer": 0}\n', "missing 'context'"),
        ("not json\n", "not JSON"),
        ("\n", "holds no items"),
    ):
        path.write_text(body)
        with pytest.raises(LabelError, match=message):
            load_mc_task(path)


# -- `lstar eval` --------------------------------------------------------------------------------
def test_lstar_eval_stores_labels(tiny_model_dir, shared_dir, tmp_path, capsys):
    db = tmp_path / "state.duckdb"
    task = shared_dir / "tasks" / "cloze-v0.jsonl"
    code = main(["eval", str(tiny_model_dir), "--task", str(task), "--limit", "6", "--db", str(db),
                 "--dtype", "float32", "--device", "cpu", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads(out)
    assert report["n_items"] == 6 and report["labels_stored"] == 4
    with Store.open(db, read_only=True) as store:
        rows = store.labels(task="cloze-v0")
        runs = store.eval_runs()
    assert {r.metric for r in rows} == {"acc", "acc_norm", "prob_correct", "brier"}
    assert all(r.n == 6 and r.eval_run_id == report["run_id"] and r.source == "builtin" for r in rows)
    assert runs[0].task_sha256 == "0a133cfc32319b93ff825496b1c37cf079fd7edd2e1d9cfcc024d362144e4c91"
    assert runs[0].item_limit == 6 and runs[0].model_sha == rows[0].sha
    by_metric = {r.metric: r for r in rows}
    assert by_metric["prob_correct"].value == pytest.approx(report["metrics"]["prob_correct"]["value"])
    # A missing task file is one line and a non-zero exit.
    code = main(["eval", str(tiny_model_dir), "--task", str(tmp_path / "none.jsonl"), "--db", str(db)])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("error: no task file") and err.count("\n") == 1


# -- joining labels with stored scores -----------------------------------------------------------
CORPUS = "9f269a7db0b131d819be2e51974914a3cf715cc388cceb82885f7a5a21e644d8"


def record_score(store: Store, repo: str, sha: str, lstar: float, *, window: int = 2048,
                 corpus: str = CORPUS, run_id: str | None = None) -> str:
    """A minimal but complete score run row (what `lstar score` writes)."""
    run = {c: None for c in Store.SCORE_RUN_COLUMNS}
    run.update(run_id=run_id or f"run-{sha[-8:]}-{window}", checkpoint_id=None, model_repo=repo,
               model_sha=sha, model_source="hub", tokenizer_fingerprint="f" * 64, corpus_sha256=corpus,
               spec_version="lstar-score/1", window_len=window, stride=window // 2, prefix_policy="eos",
               dtype="float32", device="cpu", n_tokens=1000, n_bytes=3000, nll_sum=3000.0,
               ce=lstar + 6.86, ce_unigram=6.86, lstar=lstar, l_rel=0.5, l_gain=0.5, bits_per_byte=1.4,
               tokens_per_byte=0.33, se_ce=0.02, slices={}, spec={}, model={"n_params": 162322944},
               library_versions={}, wall_s=1.0, tokens_per_s=1000.0,
               finished_at=datetime(2024, 6, 1, tzinfo=timezone.utc))
    store.record_score_run(run, [("doc-0", "prose", 1000, 3000.0, 3000)], {"sha256": corpus, "name": "lstar-calib", "version": "v0",
                                     "parent_sha256": corpus, "selection": "all", "n_documents": 1,
                                     "n_bytes": 3000},
                           {"fingerprint": "f" * 64, "source": "x", "vocab_size": 50277,
                            "prefix_policy": "eos", "prefix_token_id": 0})
    return run["run_id"]


def pythia_results(tmp_path: Path, steps_lstar_acc: list[tuple[int, float, float]]) -> Path:
    folder = tmp_path / "lm-eval"
    for i, (step, _lstar, acc) in enumerate(steps_lstar_acc):
        data = copy.deepcopy(LM_EVAL_RESULTS)
        data["config"]["model_revision"] = f"step{step}"
        data["config"]["model_args"] = f"pretrained=EleutherAI/pythia-160m,revision=step{step}"
        data["config"]["model_sha"] = f"{i + 1:040x}"
        data["results"]["arc_easy"]["acc,none"] = acc
        write_results(folder, data, stamp=f"2024-06-0{i + 1}T12-00-00.000000")
    return folder


def test_join_scores_fills_lstar_and_pins(tmp_path):
    steps = [(1000, -1.0, 0.26), (8000, -2.0, 0.30), (64000, -3.0, 0.41), (143000, -3.5, 0.44)]
    folder = pythia_results(tmp_path, steps)
    labels = [l for l in read_lm_eval_results(folder) if l.task == "arc_easy" and l.metric == "acc"]
    with Store.open(tmp_path / "s.duckdb") as store:
        for i, (_, lstar, _) in enumerate(steps):
            record_score(store, "EleutherAI/pythia-160m", f"{i + 1:040x}", lstar)
        joined, pins = join_scores(labels, store)
        assert sorted((l.lstar, l.value) for l in joined) == sorted((s[1], s[2]) for s in steps)
        assert all(l.raw_ce == pytest.approx(l.lstar + 6.86) and l.lstar_se == 0.02 for l in joined)
        assert pins == {"corpus_sha256": CORPUS, "spec_version": "lstar-score/1", "window": 2048,
                        "stride": 1024, "prefix_policy": "eos"}
        with pytest.raises(LabelError, match="on corpus 42eba56a9240"):
            join_scores(labels, store, corpus_sha256="42eba56a92409f2fbaaf1689f6772b3bda630d41ef2ead6f8d195a104253dd3a")
        # A newer score of one checkpoint under another spec: runs no longer agree.
        record_score(store, "EleutherAI/pythia-160m", f"{1:040x}", -1.0, window=1024)
        with store.transaction() as conn:
            conn.execute("UPDATE score_runs SET finished_at = ? WHERE window_len = 1024",
                         [datetime(2024, 7, 1, tzinfo=timezone.utc)])
        with pytest.raises(LabelError, match="differ in corpus or scoring spec"):
            join_scores(labels, store)


def test_curves_fit_from_lm_eval_results_and_the_store(tmp_path, capsys):
    steps = [(1000, -1.0, 0.25), (2000, -1.5, 0.26), (4000, -2.0, 0.27), (8000, -2.5, 0.31),
             (16000, -3.0, 0.38), (32000, -3.5, 0.43), (143000, -4.0, 0.45)]
    folder = pythia_results(tmp_path, steps)
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        for i, (_, lstar, _) in enumerate(steps):
            record_score(store, "EleutherAI/pythia-160m", f"{i + 1:040x}", lstar)
    out = tmp_path / "arc.json"
    code = main(["curves", "fit", "--labels", str(folder), "--db", str(db), "--task", "arc_easy",
                 "--metric", "acc", "--baseline", "0.25", "--margin", "0.03", "--out", str(out),
                 "--bootstrap", "200", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["corpus_sha256"] == CORPUS
    assert summary["scoring_spec"] == "lstar-score/1:window=2048,stride=1024,prefix=eos"
    assert summary["n_checkpoints"] == 7
    assert -3.0 < summary["threshold"]["estimate"] < -2.0
    # The fitted curve applies to a stored run of the same corpus and spec.
    code = main(["curves", "predict", str(out), "--run", "run-00000007-2048", "--db", str(db), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["lstar"] == -4.0
    # Unknown task in the results: one line, non-zero exit.
    code = main(["curves", "fit", "--labels", str(folder), "--db", str(db), "--task", "hellaswag",
                 "--baseline", "0.25", "--margin", "0.03", "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and err.startswith("error: unknown task 'hellaswag'") and err.count("\n") == 1


def test_the_output_layer_runs_on_the_continuation_positions_alone_and_gives_the_full_answer(tiny_model_dir, cloze,
                                                                                            monkeypatch):
    """`option_loglikelihoods` asks the model for the continuation positions' logits alone
    (`logits_to_keep`, a mask of the positions); the answer is the one indexed out of every
    position's logits: equal in float64, and to float32 rounding in float32. A model whose forward
    does not take the argument, or takes it and answers every position, is indexed as before."""
    import torch
    from transformers import AutoModelForCausalLM

    from monitor.curves import evaluator
    from monitor.scoring.tokenizer import load_tokenizer

    handle = load_tokenizer(tiny_model_dir)
    requests = []
    # Four items (16 requests, 4 batches of up to 5, one context of 172 tokens beside ones of
    # about 96): what is checked holds batch by batch, and each request costs three forwards
    # through the 50,257-id output layer in each dtype (12.7 CPU-s for all eight items).
    for item in cloze.items[:4]:
        for choice in item.choices:
            ctx, cont = encode_pair(handle.tokenizer, item.context, choice)
            requests.append(([handle.prefix_token_id, *ctx], cont))
    seen = []

    class Counting(torch.nn.Module):
        """Takes `logits_to_keep` and records the shape of the logits the model answered."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, logits_to_keep=0):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep)
            seen.append(tuple(out.logits.shape))
            return out

    class Plain(torch.nn.Module):
        """A forward without the argument."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    class Ignoring(Counting):
        def forward(self, input_ids, attention_mask, logits_to_keep=0):
            return super().forward(input_ids, attention_mask, logits_to_keep=0)

    class Refusing(Counting):
        """Takes the argument but, as an older slicing does, fails on a mask of positions."""

        def forward(self, input_ids, attention_mask, logits_to_keep=0):
            if isinstance(logits_to_keep, torch.Tensor):
                seen.append("refused")
                raise IndexError("too many indices for tensor of dimension 3")
            return super().forward(input_ids, attention_mask, logits_to_keep=0)

    for dtype, rtol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=dtype).eval()
        seen.clear()
        kept = evaluator.option_loglikelihoods(Counting(model), requests, batch_size=5)
        n_cont = sum(len(cont) for _, cont in requests)
        assert sum(s[0] for s in seen) == n_cont and all(len(s) == 2 for s in seen)   # [P, V] per batch
        full = evaluator.option_loglikelihoods(Plain(model), requests, batch_size=5)
        np.testing.assert_allclose(kept, full, rtol=rtol, atol=rtol)
        seen.clear()
        ignored = evaluator.option_loglikelihoods(Ignoring(model), requests, batch_size=5)
        assert all(len(s) == 3 for s in seen) and len(seen) == math.ceil(len(requests) / 5)   # one forward a batch
        np.testing.assert_array_equal(ignored, full)
        seen.clear()
        refused = evaluator.option_loglikelihoods(Refusing(model), requests, batch_size=5)
        assert seen.count("refused") == 1 and len(seen) == 1 + math.ceil(len(requests) / 5)   # asked once
        np.testing.assert_array_equal(refused, full)
        for ours, ref in zip(kept[:4], requests[:4]):   # and the naive loop, one option at a time
            naive = naive_option_loglik(model, ref[0][0], list(ref[0][1:]), list(ref[1]))
            assert ours == pytest.approx(naive, rel=rtol, abs=rtol)


def test_greedy_decoding_asks_for_the_last_positions_logits_alone_and_decodes_the_same(tiny_model_dir, cloze):
    """`greedy_exact_match_items` takes each next token from the last position's logits, which it
    asks the model for alone (`logits_to_keep=1`): the same tokens, and so the same hits, as
    taking them from every position's logits, at every decoding step of every cloze item."""
    import torch
    from transformers import AutoModelForCausalLM

    from monitor.lab.tasks import greedy_exact_match_items
    from monitor.scoring.tokenizer import load_tokenizer

    handle = load_tokenizer(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    shapes, decoded = [], []

    class Recording(torch.nn.Module):
        def __init__(self, inner, keep_all: bool):
            super().__init__()
            self.inner, self.keep_all = inner, keep_all

        def parameters(self, recurse: bool = True):
            return self.inner.parameters(recurse)

        def forward(self, input_ids, logits_to_keep=0):
            out = self.inner(input_ids=input_ids, logits_to_keep=0 if self.keep_all else logits_to_keep)
            shapes.append(tuple(out.logits.shape[:2]))
            decoded.append(int(out.logits[0, -1].argmax()))
            return out

    items = [(it.context, it.choices[it.answer].strip()) for it in cloze.items]
    runs = {}
    for keep_all in (True, False):
        shapes.clear()
        decoded.clear()
        hits = greedy_exact_match_items(Recording(model, keep_all), handle.tokenizer, items,
                                        prefix_token_id=handle.prefix_token_id)
        runs[keep_all] = (hits, list(decoded), list(shapes))
    (hits_all, tokens_all, shapes_all), (hits_last, tokens_last, shapes_last) = runs[True], runs[False]
    assert all(n == 1 for _, n in shapes_last) and any(n > 1 for _, n in shapes_all)
    assert tokens_last == tokens_all and hits_last == hits_all
