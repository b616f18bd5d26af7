"""Message bodies: Prometheus Alertmanager's webhook JSON (version "4") plus an `lstar` object.

Existing Alertmanager receivers read `status`, `receiver`, `groupLabels`, `commonLabels`,
`commonAnnotations`, `externalURL`, `truncatedAlerts` and `alerts[]` (each with status,
labels, annotations, startsAt, endsAt, generatorURL, fingerprint) and ignore the rest; the
`lstar` object carries the numbers behind each alert in the same order as `alerts[]`.

Labels and numbers are data and keep their exact values (a repo id as the Hub spells it). The
annotations are the human-readable text receivers put in front of people (a chat message, a
ticket), in whatever markup their own templates use, so they are sent as plain text with their
control, line-break and bidirectional characters made visible (`monitor.escape.plain_text`):
one line each, unable to restyle a terminal or reorder what a reader sees. They are not escaped
for any one markup, as that would show backslashes in every other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from monitor.bands import extrapolation_words
from monitor.curves.axes import AXES
from monitor.escape import plain_text

ALERTMANAGER_VERSION = "4"
LSTAR_SCHEMA = "lstar-alerts/1"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt for an alert still firing


def rfc3339(moment: datetime | None) -> str:
    """UTC RFC 3339 with a Z, as Alertmanager writes times; None is the zero time."""
    if moment is None:
        return ZERO_TIME
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def notification_id(policy: str, receiver: str, group_key: str, alert_keys: Sequence[str]) -> str:
    """A deterministic id for the message carrying these alerts to this receiver."""
    blob = "\n".join([policy, receiver, group_key, *sorted(alert_keys)])
    return "msg_" + hashlib.sha256(blob.encode()).hexdigest()[:32]


def message_id(notification: str, domain: str = "lstar-monitor") -> str:
    """The email Message-ID of a notification: `<sha256(key)[:32]@lstar-monitor>`."""
    return f"<{hashlib.sha256(notification.encode()).hexdigest()[:32]}@{domain}>"


def _common(items: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not items:
        return {}
    first = dict(items[0])
    return {k: v for k, v in sorted(first.items()) if all(i.get(k) == v for i in items[1:])}


def build_body(*, policy: str, receiver: str, group_key: str, group_labels: Mapping[str, str],
               alerts: Sequence[Mapping[str, Any]], external_url: str = "") -> dict[str, Any]:
    """The webhook body for `alerts` (alert rows: status, labels, annotations, numbers,
    starts_at, ends_at, fingerprint). Status is firing if any alert is firing."""
    items = []
    for a in alerts:
        items.append({
            "status": a["status"],
            "labels": dict(sorted(a["labels"].items())),
            "annotations": {k: plain_text(v) for k, v in sorted(a["annotations"].items())},
            "startsAt": rfc3339(a["starts_at"]),
            "endsAt": rfc3339(a["ends_at"]) if a["status"] == "resolved" else ZERO_TIME,
            "generatorURL": external_url,
            "fingerprint": a["fingerprint"],
        })
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return {
        "version": ALERTMANAGER_VERSION,
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": dict(sorted(group_labels.items())),
        "commonLabels": _common([i["labels"] for i in items]),
        "commonAnnotations": _common([i["annotations"] for i in items]),
        "externalURL": external_url,
        "alerts": items,
        "lstar": {"schema": LSTAR_SCHEMA, "policy": policy,
                  "alerts": [dict(a["numbers"]) for a in alerts]},
    }


def _fmt(value: Any, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def axis_reading(numbers: Mapping[str, Any]) -> str:
    """`bits/byte = 0.9120 ± 0.0040 (SE)`: the score's value on the curve's axis with that
    axis's SE, and the score's L* beside it when the curve is on another axis. Numbers written
    before curves had an axis are L*."""
    label = numbers.get("axis_label") or "L*"
    value = numbers.get("value", numbers.get("lstar"))
    text = f"{label} = {_fmt(value, 4)} ± {_fmt(numbers['se'], 4)} (SE)"
    if numbers.get("axis", "lstar") != "lstar" and numbers.get("lstar") is not None:
        text += f"; L* = {_fmt(numbers['lstar'], 4)} ± {_fmt(numbers.get('lstar_se'), 4)}"
    return text


def task_annotations(numbers: Mapping[str, Any], *, repo: str, commit: str, state: str,
                     resolved: bool = False) -> dict[str, str]:
    """Human-readable summary and description of a task alert (also used by the email).

    The curve's own warnings (`numbers["curve_warnings"]`) go into a `curve_warnings`
    annotation, and an unresolved threshold is stated in the description.
    """
    lo, hi = numbers["interval"]
    where = f"{repo}@{commit[:12]}"
    level = f"{numbers['confidence'] * 100:.0f}%"
    if resolved:
        summary = f"{numbers['task']} is clear again for {where}"
    else:
        summary = f"{numbers['task']} {state.replace('_', ' ')} for {where}"
    description = (
        f"{axis_reading(numbers)}. The task curve "
        f"{str(numbers['curve_id'])[:12]} predicts performance {_fmt(numbers['p_hat'])}, {level} interval "
        f"[{_fmt(lo)}, {_fmt(hi)}], against the threshold b + ε = {_fmt(numbers['floor'])} + "
        f"{_fmt(numbers['margin'])} = {_fmt(numbers['threshold'])}. State: {numbers['state']}.")
    annotations = {"summary": summary, "description": description}
    derivative = numbers.get("derivative")
    if derivative:   # which coordinate drove the state, and whether the task residual was measured
        annotations["coordinates"] = coordinates_text(derivative)
        annotations["description"] += " " + annotations["coordinates"] + "."
    beyond = extrapolation_words(numbers.get("extrapolation"),  # type: ignore[arg-type]
                                 AXES[numbers["axis"]].unit if numbers.get("axis") in AXES else "")
    if beyond:   # the curve answers beyond its references: say how far, and that the band widened
        annotations["extrapolation"] = beyond
        annotations["description"] += f" The score is {beyond}; the interval is widened for it."
    warnings = numbers.get("curve_warnings") or []
    unresolved = [w["message"] for w in warnings if w.get("unresolved")]
    if unresolved:
        annotations["description"] += (" The curve's threshold is UNRESOLVED, so this state is not "
                                       "established: " + "; ".join(unresolved) + ".")
    if warnings:
        annotations["curve_warnings"] = "; ".join(w["message"] for w in warnings)
    caveats = numbers.get("caveats") or []
    if caveats:   # e.g. the state rests on a partial (sequential) score
        annotations["caveats"] = "; ".join(caveats)
        annotations["description"] += " Caveat: " + "; ".join(caveats) + "."
    return annotations


def coordinates_text(derivative: Mapping[str, Any]) -> str:
    """`a finetune of org/base@0123456789ab: state from L*(base) = 2.1000 (own L* = 1.9000);
    ρ unmeasured`: a derivative's two coordinates, the one the state rests on, and ρ."""
    base = f"{derivative.get('base_repo')}@{str(derivative.get('base_sha') or '?')[:12]}"
    own = f"own L* = {_fmt(derivative.get('lstar_own'), 4)}"
    if derivative.get("coordinate") == "base":
        text = (f"a {derivative.get('relation')} of {base}: state from L*(base) = "
                f"{_fmt(derivative.get('lstar_base'), 4)} ({own})")
    else:
        text = f"a {derivative.get('relation')} of {base}: state from its own coordinate ({own})"
    residual = derivative.get("residual")
    if residual:
        text += (f", plus the mean residual {residual['mean']:+.3f} ± {residual['se']:.3f} (SE) of "
                 f"{residual['n_pairs']} labelled pairs")
    rho = derivative.get("rho")
    if rho:
        interval = rho.get("interval")
        text += f"; ρ measured = {rho['rho']:+.3f}" + (
            f" [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "")
    else:
        text += "; ρ unmeasured"
    return text


def gaming_annotations(numbers: Mapping[str, Any], *, repo: str, commit: str,
                       resolved: bool = False) -> dict[str, str]:
    """Summary and description of a calibration-gaming alert."""
    where = f"{repo}@{commit[:12]}"
    summary = (f"public and private L* agree again for {where}" if resolved else
               f"possible calibration gaming: {where} is better on the public corpus")
    description = (
        f"L*(public) − L*(private) = {_fmt(numbers['diff'], 4)}, expected "
        f"{_fmt(numbers['expected_offset'], 4)} from {numbers['n_references']} reference "
        f"checkpoint(s); SE of the difference {_fmt(numbers['se_diff'], 4)}; "
        f"z = {_fmt(numbers['z'], 2)} against k = {_fmt(numbers['k'], 2)}. A public corpus can "
        "be trained on; the private one cannot.")
    return {"summary": summary, "description": description}
