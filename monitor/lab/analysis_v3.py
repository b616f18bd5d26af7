"""Lab v3's verdict (docs/lab-v3-preregistration.md): the pilot gate, the power of the design
as run, the primary comparison by the pre-registered rule, the secondaries and the negative
control, from race rows alone (`monitor.lab.rows_v3`; it never reads lab.json).

The race itself is v2's (`monitor.lab.analysis`): leave-one-family-out crossing error per
family, the sign-flip test over families, the two-stage refit bootstrap, Holm. What v3 adds:

- the rule reads the primary text only (the pool's held-out split, in distribution); calib-v0
  is a secondary that shows the out-of-domain case;
- the race counts only when the pilot gate passed and the negative control failed (bytes
  seen, a clock when every family reads the same bytes, must not transfer);
- the power the realised design (families kept × seeds) achieves, from the pre-registered
  table (`monitor.lab.power`), and the design's deviations from the pre-registration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monitor.curves.axis_choice import finite_json
from monitor.errors import CurveError, LabelError
from monitor.lab import analysis as race
from monitor.lab import power
from monitor.lab.pilot import level_margin, pilot_gate
from monitor.lab.rows_v3 import check_rows_v3, data_assignment_check

SCHEMA = "lstar-lab-race/3"


def _config(prereg: Mapping[str, Any], metric: str, resamples: int | None = None) -> race.RaceConfig:
    t = prereg["test"]
    return race.RaceConfig(margin=level_margin(prereg, metric), alpha=t["alpha"], interval=t["interval"],
                           resamples=resamples or t["resamples"], permutations=t["permutations"], seed=t["seed"])


def compare(rows: Sequence[Mapping[str, Any]], prereg: Mapping[str, Any], *, task: str, metric: str, text: str,
            axes: Sequence[str], bootstrap: bool, resamples: int | None = None) -> dict[str, Any]:
    """v2's race of `axes` against L* on one task metric and text: per axis its LOFO errors per
    family and, against L*, the family-averaged difference, sign-flip p and (with `bootstrap`)
    the refit-bootstrap interval."""
    cfg = _config(prereg, metric, resamples)
    chosen = [r for r in rows if r["text"] == text and metric in r["metrics"].get(task, {})]
    if len({r["family"] for r in chosen}) < 2:
        return {"ran": False, "reason": f"fewer than two families with {task}/{metric} on {text}"}
    baseline = race._baseline(chosen, task, metric)
    d = race._data(chosen, task, metric, text, (race.REFERENCE, *axes))
    if race.REFERENCE not in d.xs or any(a not in d.xs for a in axes):
        return {"ran": False, "reason": f"an axis is missing on some rows ({', '.join(d.missing)})"}
    try:
        lofo = race._lofo(d, np.arange(len(d.y)), None, baseline=baseline, margin=cfg.margin, seed=cfg.seed)
        boot, degenerate = (race._refit_bootstrap(d, baseline=baseline, margin=cfg.margin, cfg=cfg,
                                                  seed=[cfg.seed, 3]) if bootstrap else (None, 0))
    except (LabelError, CurveError) as exc:
        return {"ran": False, "reason": exc.message}
    above = int(np.sum(d.y >= baseline + cfg.margin))
    return {"ran": True, "task": task, "metric": metric, "text": text, "baseline": baseline,
            "level": baseline + cfg.margin, "n_rows": len(d.y), "above_level": above,
            "level_crossed": 0 < above < len(d.y),
            "axes": race._compare(d, lofo, boot=boot, degenerate=degenerate, cfg=cfg)}


def negative_control(result: Mapping[str, Any], prereg: Mapping[str, Any]) -> dict[str, Any]:
    """Bytes seen must not transfer: its family-averaged LOFO crossing error on the primary
    task metric and text must exceed that of the better axis of the primary comparison (else
    neither loss axis carries more than how far training got)."""
    spec = prereg["negative_control"]
    base = {"axis": spec["axis"], "against": spec["against"], "criterion": spec["criterion"]}
    if not result.get("ran"):
        return {**base, "ran": False, "failed_to_transfer": None, "reason": result.get("reason")}
    axes = result["axes"]
    means = {a: (axes.get(a) or {}).get("family_mean", {}).get("crossing_error") for a in (spec["axis"], *spec["against"])}
    if any(v is None for v in means.values()):
        return {**base, "ran": False, "failed_to_transfer": None, "reason": "an axis could not be raced",
                "family_mean_crossing_error": means}
    failed = means[spec["axis"]] > min(means[a] for a in spec["against"])
    return {**base, "ran": True, "family_mean_crossing_error": means, "failed_to_transfer": bool(failed),
            "reading": ("bytes seen failed to transfer, as the design requires" if failed else
                        "bytes seen did NOT fail to transfer: it is still a clock, and the race does not count")}


def design(rows: Sequence[Mapping[str, Any]], prereg: Mapping[str, Any]) -> dict[str, Any]:
    """The realised design against the pre-registered one, and the power it achieves."""
    fams = sorted({r["family"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    per_family_seeds = {f: len({r["seed"] for r in rows if r["family"] == f}) for f in fams}
    data = data_assignment_check(rows)
    deviations = []
    if len(fams) < prereg["families"]["min_kept"]:
        deviations.append(f"{len(fams)} families, fewer than the pre-registered {prereg['families']['min_kept']}")
    if min(per_family_seeds.values()) < len(prereg["seeds"]):
        deviations.append(f"a family has {min(per_family_seeds.values())} seed(s), fewer than the "
                          f"pre-registered {len(prereg['seeds'])}")
    if not data["holds"]:
        deviations.append("the per-family data rule does not hold (a lineage with several data samples, or "
                          "a sample shared by families)")
    k = min(per_family_seeds.values())
    table = prereg["power"]["table"]
    looked = power.table_lookup(table, len(fams), k)
    if looked is None and 2 <= len(fams) <= power.MAX_FAMILIES:
        looked = {f"{e:g}": power.simulate_power(len(fams), k, e, alpha=table["alpha"], replicates=table["replicates"],
                                                 seed=table["seed"]) for e in table["effects"]}
    return {"families": fams, "n_families": len(fams), "seeds": seeds, "seeds_per_family_min": k,
            "n_checkpoints": len({(r["family"], r["seed"], r["step"]) for r in rows}),
            "texts": sorted({r["text"] for r in rows}), "data_assignment": data, "deviations": deviations,
            "power": {"families": len(fams), "seeds": k, "alpha": table["alpha"], "by_effect": looked,
                      "model": "conservative (by_effect: standardised effect -> power); measured: the measured "
                               "spread of each v2 effect, at three seeds only",
                      "measured": {m["name"]: (m["power"].get(str(len(fams))) if k == power.V2_SEEDS else None)
                                   for m in prereg["power"].get("measured", [])},
                      "source": "pre-registered table" if power.table_lookup(table, len(fams), k) is not None
                      else "simulated with the table's settings"}}


def verdict(primary: Mapping[str, Any], prereg: Mapping[str, Any], *, gate: Mapping[str, Any],
            control: Mapping[str, Any]) -> dict[str, Any]:
    """The pre-registered rule on the primary comparison."""
    spec = prereg["primary"]
    alpha = prereg["test"]["alpha"]
    row = (primary.get("axes") or {}).get(spec["axis"]) or {}
    c = (row.get("vs_reference") or {}).get("crossing_error") or {}
    d, p, lo, hi = c.get("difference"), c.get("p_value"), c.get("lower"), c.get("upper")
    sign = race._sign(d)
    checks = {"pilot_gate_passed": bool(gate.get("passed")),
              "negative_control_failed_to_transfer": control.get("failed_to_transfer") is True,
              "level_crossed": bool(primary.get("level_crossed")),
              "permutation_p_below_alpha": p is not None and p < alpha,
              "interval_excludes_zero": lo is not None and hi is not None and sign != 0
                                        and race._sign(lo) == sign and race._sign(hi) == sign}
    decided = all(checks.values())
    label, ref = race.AXES[spec["axis"]].label, race.AXES[spec["reference"]].label
    if not checks["pilot_gate_passed"]:
        statement = "not run: the pilot gate stopped the race"
    elif decided:
        statement = f"{label} transfers better than {ref}" if sign < 0 else f"{ref} transfers better than {label}"
    else:
        statement = "not distinguishable"
    return {**spec, "difference": d, "p_value": p, "lower": lo, "upper": hi,
            "per_family": c.get("per_family"), "n_families": (row.get("vs_reference") or {}).get("n_families"),
            "checks": checks, "failed": [k for k, ok in checks.items() if not ok], "decided": decided,
            "statement": statement}


def secondaries(rows: Sequence[Mapping[str, Any]], prereg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each pre-registered secondary comparison: difference, sign-flip p, Holm-adjusted p."""
    out = []
    for s in prereg["secondary"]:
        r = compare(rows, prereg, task=s["task"], metric=s["metric"], text=s["text"], axes=(s["axis"],),
                    bootstrap=False)
        c = (((r.get("axes") or {}).get(s["axis"]) or {}).get("vs_reference") or {}).get("crossing_error") or {}
        out.append({**s, "ran": r.get("ran", False), "reason": r.get("reason"), "difference": c.get("difference"),
                    "p_value": c.get("p_value"), "level_crossed": r.get("level_crossed")})
    # Holm "across the five" (the pre-registration): a secondary that could not run still counts
    # in m, as a p of 1 (last in Holm's order, so it never lowers another's factor); race.holm
    # alone would leave it out of m and make the others easier to pass.
    adjusted = race.holm({str(i): (1.0 if s["p_value"] is None or not math.isfinite(s["p_value"]) else s["p_value"])
                          for i, s in enumerate(out)})
    alpha = prereg["test"]["alpha"]
    for i, s in enumerate(out):
        s["p_holm"] = None if s["p_value"] is None or not math.isfinite(s["p_value"]) else adjusted[str(i)]
        s["passes"] = s["p_holm"] is not None and s["p_holm"] < alpha and bool(s["level_crossed"])
    return out


def analyse_v3(rows: Sequence[Mapping[str, Any]], prereg: Mapping[str, Any], *,
               pilot_rows: Sequence[Mapping[str, Any]] | None = None, resamples: int | None = None) -> dict[str, Any]:
    """Every number of lab v3's verdict, JSON-ready: `pilot_gate`, `power` (in `design`),
    `primary`, `negative_control`, `secondary`."""
    clean = check_rows_v3(rows)
    gate = (pilot_gate(pilot_rows, prereg) if pilot_rows else
            {"ran": False, "passed": False, "reason": "no pilot rows: the gate was not run, so the race is not run"})
    import sklearn

    with sklearn.config_context(skip_parameter_validation=True, assume_finite=True):
        spec = prereg["primary"]
        ctl = prereg["negative_control"]
        axes = tuple(a for a in dict.fromkeys((spec["axis"], ctl["axis"], *ctl["against"])) if a != race.REFERENCE)
        primary = (compare(clean, prereg, task=spec["task"], metric=spec["metric"], text=spec["text"], axes=axes,
                           bootstrap=True, resamples=resamples)
                   if gate.get("passed") else {"ran": False, "reason": "the pilot gate did not pass"})
        control = negative_control(primary, prereg)
        result = verdict(primary, prereg, gate=gate, control=control)
        second = secondaries(clean, prereg) if gate.get("passed") else []
    des = design(clean, prereg)
    return finite_json({"schema": SCHEMA, "rule": prereg["rule"], "pilot_gate": gate, "power": des["power"],
                        "design": des, "primary": result, "primary_race": primary,
                        "negative_control": control, "secondary": second})
