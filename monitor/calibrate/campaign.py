"""The campaign file of `lstar calibrate`: which checkpoints, tasks and corpus make a set of curves.

A campaign is strict YAML read with the policy files' defences (`monitor.yamlio`: bounded
size and nesting, no tags, no alias bombs, no duplicate keys) and validated by strict
pydantic models (unknown keys are errors, no type coercion). Every error is one line naming
the file, the line and the key path, and says what to write instead::

    campaign.yaml:14: checkpoints[2].ref: 'org/model@main' is not pinned; write org/name@<40-hex commit sha>

Relative paths (corpus, local checkpoints, task files, results, output) are relative to the
campaign file, as a policy's curve paths are relative to the policy.

    name: pythia-cloze
    corpus: {dir: ../shared/corpus/calib-v0, every: 8}
    scoring: {dtype: auto, device: auto, batch_size: 8, backend: local}
    checkpoints:
      - {ref: EleutherAI/pythia-70m@<sha>, family: pythia}
      - {ref: models/tiny-a, family: tiny, name: tiny-a}
    tasks:
      - {builtin: ../shared/tasks/cloze-v0.jsonl, limit: 40}
      - {lm_eval: lambada_openai, baseline: 0.0}
      - {results: results/, baseline: 0.25}
    fit: {metrics: [acc], margin: 0.1}
    output: out/pythia-cloze
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePath
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from monitor.calibrate.manifest import CampaignId, output_problem
from monitor.curves.evaluator import load_mc_task
from monitor.errors import CampaignError, LstarError, PolicyError
from monitor.files import FileKind, read_bounded_text
from monitor.scoring.precision import DTypeChoice
from monitor.yamlio import compose_mapping, format_key_path, node_line, validation_lines

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$"
_HUB_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+)@(?P<sha>[^\s@]*)$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:[0-9]{1,3})$")
# The same bounds as the CLI's flags (monitor.commands.options); not imported from there:
# the library does not depend on the command layer.
MAX_BATCH = 4096
MAX_RESAMPLES = 100_000
MAX_SEED = 2**32 - 1
CAMPAIGN_FILE = FileKind("campaign file", "campaign files", "YAML")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class CorpusSpec(_Strict):
    """The pinned corpus every checkpoint is scored on, and an optional selection of it
    (as `lstar score --slices/--every/--docs` take it)."""

    dir: str
    every: int | None = Field(None, ge=1, le=100_000)
    docs: int | None = Field(None, ge=1)
    slices: list[str] | None = Field(None, min_length=1)


class ScoringSpec(_Strict):
    """How every checkpoint is scored; one spec for the whole campaign, so all L* share it."""

    dtype: DTypeChoice = "auto"
    device: str = "auto"
    batch_size: int = Field(8, ge=1, le=MAX_BATCH)
    max_context: int | None = Field(None, ge=2)
    stride: int | None = Field(None, ge=1)
    disjoint: bool = False
    with_tcb: bool = False
    n_boot: int = Field(1000, ge=2, le=MAX_RESAMPLES)
    backend: Literal["local", "ray"] = "local"
    ray_address: str | None = None

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError(f"value {value!r} is not a device (write auto, cpu, cuda or cuda:N)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ScoringSpec":
        if self.stride is not None and self.disjoint:
            raise ValueError("stride and disjoint contradict each other (disjoint means stride = window); "
                             "give one of them")
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError("ray_address is set but backend is not 'ray'; set backend: ray or drop ray_address")
        return self


class CheckpointSpec(_Strict):
    """A reference checkpoint: `org/name@<40-hex sha>` on the Hub (pinned), or a local folder."""

    ref: str = Field(min_length=1)
    family: str = Field(pattern=_NAME_PATTERN)
    name: str | None = Field(None, pattern=_NAME_PATTERN)

    @field_validator("ref")
    @classmethod
    def _pinned(cls, value: str) -> str:
        match = _HUB_REF.match(value)
        if match is not None and not _SHA.match(match["sha"]):
            raise ValueError(f"{value!r} is not pinned; write {match['repo']}@<40-hex commit sha> "
                             "(a branch or tag can move under the curve)")
        if match is not None:
            try:
                validate_repo_id(match["repo"])   # the Hub's own rules: no '..', '--', edge '.' or '-'
            except HFValidationError as exc:
                raise ValueError(f"{match['repo']!r} is not a Hub repo id: {' '.join(str(exc).split())[:200]}") \
                    from None
        return value

    @property
    def hub(self) -> tuple[str, str] | None:
        """(repo, sha) of a Hub checkpoint; None for a local folder."""
        match = _HUB_REF.match(self.ref)
        return (match["repo"], match["sha"]) if match is not None else None


class TaskSpec(_Strict):
    """One task: exactly one of `builtin` (a multiple-choice JSONL file for the built-in
    evaluator), `lm_eval` (an lm-evaluation-harness task name) or `results` (lm-eval
    results JSON, a folder of them, or a labels CSV, imported as they are).

    baseline: the task's random baseline b_t (the built-in evaluator knows it: 1/k);
    metrics:  the metrics to fit (default: the campaign's `fit.metrics`);
    limit:    evaluate only the first N items (builtin, lm_eval);
    num_fewshot: lm-eval's few-shot count;
    include:  a folder of lm-eval task YAML files that defines `lm_eval` (a task of your own;
              only that folder is indexed, so it cannot name the harness's built-in tasks).
    """

    builtin: str | None = None
    lm_eval: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    results: str | None = None
    baseline: float | None = Field(None, ge=0.0, lt=1.0)
    metrics: list[str] | None = Field(None, min_length=1)
    limit: int | None = Field(None, ge=1)
    num_fewshot: int | None = Field(None, ge=0, le=100)
    include: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "TaskSpec":
        given = [k for k in ("builtin", "lm_eval", "results") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a task names exactly one of builtin, lm_eval or results (got "
                             f"{', '.join(given) or 'none'})")
        if self.results is not None and (self.limit is not None or self.num_fewshot is not None):
            raise ValueError("limit and num_fewshot apply to evaluated tasks, not to imported results")
        if self.lm_eval is None and self.include is not None:
            raise ValueError("include (a folder of lm-eval task YAML files) applies to lm_eval tasks only")
        if self.builtin is not None and self.num_fewshot is not None:
            raise ValueError("num_fewshot applies to lm_eval tasks; the built-in evaluator is zero-shot")
        return self

    @property
    def kind(self) -> Literal["builtin", "lm_eval", "results"]:
        return "builtin" if self.builtin is not None else "lm_eval" if self.lm_eval is not None else "results"


class FitSpec(_Strict):
    """How each task curve is fitted and validated (the options of `lstar curves fit|validate`)."""

    metrics: list[str] = Field(default_factory=lambda: ["acc"], min_length=1)
    axis: Literal["lstar", "raw_ce", "log_params", "log_flops"] = "lstar"
    margin: float = Field(gt=0.0, le=1.0)
    confidence: float = Field(0.9, gt=0.0, lt=1.0)
    n_boot: int = Field(1000, ge=50, le=MAX_RESAMPLES)
    lofo_n_boot: int = Field(200, ge=50, le=MAX_RESAMPLES)
    seed: int = Field(0, ge=0, le=MAX_SEED)


class HubSpec(_Strict):
    """Where Hub checkpoints come from (default: HF_ENDPOINT and HF_HUB_CACHE)."""

    endpoint: str | None = None
    cache_dir: str | None = None

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"value {value!r} is not an http(s) URL (e.g. https://huggingface.co)")
        return value


class Campaign(_Strict):
    """A calibration campaign: reference checkpoints × tasks on one corpus → task curves."""

    name: str = Field(pattern=_NAME_PATTERN)
    corpus: CorpusSpec
    scoring: ScoringSpec = Field(default_factory=ScoringSpec)
    checkpoints: list[CheckpointSpec] = Field(min_length=1)
    tasks: list[TaskSpec] = Field(min_length=1)
    fit: FitSpec
    output: str
    hub: HubSpec = Field(default_factory=HubSpec)

    _base: Path = PrivateAttr(default=Path("."))
    _label: str = PrivateAttr(default="campaign")
    _file: Path | None = PrivateAttr(default=None)
    _output_dir: Path | None = PrivateAttr(default=None)

    def path(self, value: str) -> Path:
        """A path of the campaign file, resolved against the file's folder."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else self._base / p

    @property
    def label(self) -> str:
        """How errors name the campaign file."""
        return self._label

    @property
    def output_dir(self) -> Path:
        """The output folder: its real path (every link resolved) as checked at load time,
        so writes go where the check looked."""
        return self._output_dir if self._output_dir is not None else self.path(self.output)

    @property
    def identity(self) -> CampaignId:
        """The campaign as the output folder's manifest names it: its name and resolved file."""
        return CampaignId(self.name, str(self._file) if self._file is not None else self._label)

    def checkpoint_name(self, i: int) -> str:
        """The name labels and curve points use for checkpoint `i`."""
        spec = self.checkpoints[i]
        if spec.name:
            return spec.name
        hub = spec.hub
        return f"{hub[0]}@{hub[1][:12]}" if hub else Path(spec.ref).name


def _cross_errors(campaign: Campaign, root: Any, label: str, *, output_given: bool = False) -> list[str]:
    """What the schema cannot see: files that must exist, names that must be unique.
    `output_given`: the output folder came from the command line, not from the file."""
    errors: list[str] = []

    def error(loc: list[Any], message: str) -> None:
        line, _ = node_line(root, loc)
        errors.append(f"{label}:{line}: {format_key_path(loc)}: {message}")

    output = PurePath(campaign.output)
    real = _real_output(campaign)
    if not output_given and (campaign.output.strip() in ("", ".") or output.is_absolute()
                             or ".." in output.parts or campaign.output.startswith("~")):
        error(["output"], f"output {campaign.output!r} must be a folder inside the campaign file's folder "
                          "(a relative path without '..'); to write elsewhere, run lstar calibrate --output DIR")
    elif real is None:
        error(["output"], f"output {campaign.output!r} cannot be resolved (a symbolic link loop?)")
    elif not output_given and not _strictly_inside(real, campaign):
        error(["output"], f"output {campaign.output!r} leads to {real} through a symbolic link, outside the "
                          "campaign file's folder; point it at a real folder inside, or run lstar calibrate "
                          "--output DIR")
    elif real.exists() and not real.is_dir():
        error(["output"], f"output {campaign.output!r} exists and is not a folder")
    elif (problem := output_problem(real)) is not None:
        error(["output"], problem)
    if not (campaign.path(campaign.corpus.dir) / "manifest.json").is_file():
        error(["corpus", "dir"], f"no corpus at {campaign.corpus.dir!r} (no manifest.json there; "
                                 "paths are relative to the campaign file)")
    names: dict[str, int] = {}
    refs: dict[str, int] = {}
    for i, spec in enumerate(campaign.checkpoints):
        if spec.hub is None:
            folder = campaign.path(spec.ref)
            if not folder.is_dir():
                error(["checkpoints", i, "ref"], f"no folder {spec.ref!r} (paths are relative to the campaign "
                                                 "file; a Hub checkpoint is written org/name@<40-hex sha>)")
            elif not (folder / "config.json").is_file():
                error(["checkpoints", i, "ref"], f"folder {spec.ref!r} is not a checkpoint (no config.json in it)")
            key = str(folder.resolve()) if folder.is_dir() else spec.ref
        else:
            key = spec.ref
        if key in refs:
            error(["checkpoints", i, "ref"], f"checkpoint {spec.ref!r} is listed twice (also checkpoints[{refs[key]}])")
        refs.setdefault(key, i)
        name = campaign.checkpoint_name(i)
        if name in names:
            error(["checkpoints", i, "name" if spec.name else "ref"],
                  f"checkpoint name {name!r} is used twice (also checkpoints[{names[name]}]); give each a `name`")
        names.setdefault(name, i)
    if len({spec.family for spec in campaign.checkpoints}) < 2:
        error(["checkpoints"], "all checkpoints are of one family; leave-one-family-out validation needs "
                               "at least 2 families")
    seen: dict[str, int] = {}
    for i, task in enumerate(campaign.tasks):
        if task.builtin is not None and not campaign.path(task.builtin).is_file():
            error(["tasks", i, "builtin"], f"no task file {task.builtin!r} (paths are relative to the campaign file)")
        elif task.builtin is not None:
            try:   # found now, not after hours of scoring
                load_mc_task(campaign.path(task.builtin), limit=task.limit)
            except (LstarError, UnicodeDecodeError) as exc:
                why = exc.one_line() if isinstance(exc, LstarError) else f"not UTF-8 text ({exc.reason})"
                error(["tasks", i, "builtin"], f"task file {task.builtin!r} is not a multiple-choice task: {why}")
        if task.results is not None and not campaign.path(task.results).exists():
            error(["tasks", i, "results"], f"no results file or folder {task.results!r} "
                                           "(paths are relative to the campaign file)")
        if task.include is not None and not campaign.path(task.include).is_dir():
            error(["tasks", i, "include"], f"no folder {task.include!r} (paths are relative to the campaign file)")
        if task.kind != "builtin" and task.baseline is None:
            error(["tasks", i], f"a {task.kind} task needs `baseline` (its random baseline b_t, e.g. 0.25 "
                                "for four options); only the built-in evaluator knows it")
        key = task.builtin or task.lm_eval or task.results or ""
        if key in seen:
            error(["tasks", i], f"task {key!r} is listed twice (also tasks[{seen[key]}])")
        seen.setdefault(key, i)
    return errors


def _real_output(campaign: Campaign) -> Path | None:
    """The output folder with every symbolic link of every component resolved."""
    try:
        return campaign.path(campaign.output).resolve()
    except (OSError, RuntimeError):   # a link loop
        return None


def _strictly_inside(real: Path, campaign: Campaign) -> bool:
    """Whether `real` is a folder below (not at) the campaign file's folder, both resolved."""
    try:
        base = campaign.path(".").resolve()
    except (OSError, RuntimeError):
        return False
    return base in real.parents


def parse_campaign(text: str, label: str, *, base: Path, output: Path | None = None) -> Campaign:
    """Validate campaign text; `label` names the file in errors, `base` anchors relative paths.

    A campaign file writes only inside its own folder; `output` (the command line's choice)
    replaces the file's `output` with any folder."""
    try:
        root, data = compose_mapping(text, label,
                                     empty="a campaign needs name, corpus, checkpoints, tasks, fit and output",
                                     keys=" (name, corpus, checkpoints, tasks, fit, output)",
                                     what=CAMPAIGN_FILE)
    except PolicyError as exc:
        raise CampaignError(exc.one_line()) from None
    try:
        campaign = Campaign.model_validate(data)
    except ValidationError as exc:
        raise CampaignError(_one_line(validation_lines(exc, root, label, Campaign))) from None
    if output is not None:
        campaign = campaign.model_copy(update={"output": str(Path(output).expanduser().resolve())})
    campaign._base = base
    campaign._label = label
    errors = _cross_errors(campaign, root, label, output_given=output is not None)
    if errors:
        raise CampaignError(_one_line(errors))
    campaign._output_dir = _real_output(campaign)
    return campaign


def _one_line(lines: list[str]) -> str:
    """The first problem, and how many more there are (the CLI prints one line)."""
    more = len(lines) - 1
    return lines[0] + (f" (and {more} more problem{'s' if more > 1 else ''} after it)" if more > 0 else "")


def load_campaign(path: str | Path, *, output: Path | None = None) -> Campaign:
    """Read and validate a campaign file (a regular file of bounded size, strict YAML);
    `output` writes the results to that folder instead of the file's `output`."""
    path = Path(path)
    label = str(path)
    if not path.exists():
        if path.is_symlink():
            raise CampaignError(f"{path}: is a symbolic link to {os.readlink(path)}, which does not exist",
                                hint="pass the path of a campaign YAML file")
        raise CampaignError(f"no campaign file at {path}", hint="pass the path of a campaign YAML file")
    try:   # a folder, a FIFO or a device is named as such, and a FIFO is opened without blocking
        text = read_bounded_text(path, label, what=CAMPAIGN_FILE)
    except PolicyError as exc:
        raise CampaignError(exc.one_line()) from None
    campaign = parse_campaign(text, label, base=path.resolve().parent, output=output)
    campaign._file = path.resolve()
    return campaign
