"""`lstar policy check`'s warning for a task whose curve a stored stress result flags.

The policy stays valid (a flag qualifies forecasts, it does not break them), so this is a
warning, as the derivative-pair one is: it names the task, the curve, the exceeded limit and
where the limits are documented."""

from __future__ import annotations

from pathlib import Path


def policy_stress_warnings(path: Path, db: Path) -> list[str]:
    """One line per stress flag on the curve of each task of the policy file at `path`, read
    from the database `db` (none when it is absent or unreadable: a warning never fails the check)."""
    from monitor.curves.artifact import load_curve
    from monitor.policy import load_policy
    from monitor.store import Store
    from monitor.stress.storage import stress_flags_for_curve

    if not db.is_file():
        return []
    try:
        policy = load_policy(path, check_curves=False)
    except Exception:  # noqa: BLE001 - it passed the check; nothing to add if it cannot be read again
        return []
    curves = {}
    for i, task in enumerate(policy.tasks):
        try:
            curves[i] = load_curve(policy.resolve_path(task.curve)).curve_id
        except Exception:  # noqa: BLE001 - the check proper has read this curve
            continue
    lines = []
    try:
        with Store.open(db, read_only=True) as store:
            for i, curve_id in curves.items():
                task = policy.tasks[i]
                for flag in stress_flags_for_curve(store, curve_id):
                    lines.append(f"tasks[{i}] {task.name}: curve {curve_id[:12]} is flagged by stress limit "
                                 f"{flag.limit}: {flag.message} (docs/stress.md#limits)")
    except Exception as exc:  # noqa: BLE001 - a warning must never fail the check
        return [f"stress flags not read: {db} could not be read ({' '.join(str(exc).split())[:160]})"]
    return lines
