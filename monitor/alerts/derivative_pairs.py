"""`lstar policy check`'s warning for `derivatives: residual` with too few labelled pairs.

A task that judges derivatives by residual adds the mean residual ρ̄ of labelled base/derivative
pairs of the same relation (`monitor.alerts.derivatives`); with fewer than MIN_PAIRS such pairs
every derivative of that relation is not evaluated. The policy is still valid (labels can be
imported later, `lstar calibrate` / `lstar eval`), so this is a warning, not a refusal: it names
the task, the pairs the state folder holds per relation, and the fix.
"""

from __future__ import annotations

from pathlib import Path

from monitor.alerts.derivatives import MIN_PAIRS
from monitor.policy import Policy


def _pair_counts(db: Path, task: str, metric: str) -> dict[str, int] | str:
    """{relation: labelled pairs with a pinned base} for (task, metric), or why it could not be read."""
    from monitor.store import Store

    if not db.is_file():
        return f"no database at {db}"
    try:
        with Store.open(db, read_only=True) as store:
            rows = store.labelled_pair_counts(task, metric)
    except Exception as exc:  # noqa: BLE001 - a warning about the labels must never fail the check
        return f"{db} could not be read ({' '.join(str(exc).split())[:160]})"
    return rows


def residual_pair_warnings(policy: Policy, db: Path) -> list[str]:
    """One line per task with `derivatives: residual` whose (task, metric) has fewer than
    MIN_PAIRS labelled base/derivative pairs of any relation in `db` (none when all have enough)."""
    from monitor.curves.artifact import load_curve

    lines = []
    for i, task in enumerate(policy.tasks):
        if task.derivatives != "residual":
            continue
        try:
            curve = load_curve(policy.resolve_path(task.curve))
        except Exception:  # noqa: BLE001 - the check proper has read this curve; nothing to add
            continue
        counts = _pair_counts(db, curve.task, curve.metric)
        if isinstance(counts, dict) and max(counts.values(), default=0) >= MIN_PAIRS:
            continue
        found = (counts if isinstance(counts, str) else
                 ", ".join(f"{n} {relation}" for relation, n in sorted(counts.items())) or "none")
        lines.append(
            f"tasks[{i}] {task.name}: derivatives: residual needs at least {MIN_PAIRS} labelled base/derivative "
            f"pairs of one relation for {curve.task}/{curve.metric} (found: {found}); until then its derivatives "
            "are not evaluated. Import labels of derivatives (lstar eval, lstar calibrate) or use "
            "derivatives: base")
    return lines
