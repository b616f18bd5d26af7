"""Label values the program itself sets, and matchers on them that can never match.

`alertname` and `state` are closed sets: every alert carries one of a few values the
program writes (a policy's own labels cannot override them). A matcher on such a label
that no member satisfies is a typo (`state="firing"`, `alertname="LstarEmergence"`) that
would otherwise leave a route or a silence silently dead; routes and silences refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from monitor.policy.matchers import Matcher
from monitor.yamlio import clip

# The states of evaluated alerts; `flagged` is the firing state of the calibration-gaming rule.
STATES: tuple[str, ...] = ("clear", "at_risk", "emerged", "flagged")
TASK_ALERTNAME = "LstarTaskEmergence"
GAMING_ALERTNAME = "LstarCalibrationGaming"
META_ALERTNAME = "LstarDeliveryFailed"
# An observation (the task run on a checkpoint) checked a prediction; a curve's intervals
# cover its observations less often than they claim.
CONTRADICTED_ALERTNAME = "LstarPredictionContradicted"
CONFIRMED_ALERTNAME = "LstarPredictionConfirmed"
MISCALIBRATED_ALERTNAME = "LstarCurveMiscalibrated"
# The states an observation gives a checkpoint's task (the `state` of its alert).
OBSERVED_STATES: tuple[str, ...] = ("observed_emerged", "observed_clear", "observed_unresolved")
# The states of operator alerts (their `kind`): a dead-lettered or disabled receiver, a Hub
# outage, a disk that was full. They skip the routing tree but silences see them.
OPERATOR_STATES: tuple[str, ...] = ("dead", "disabled", "hub-outage", "disk-full", "miscalibrated")

# What the routing tree sees: task, calibration-gaming and observation alerts.
ROUTED_VALUES: Mapping[str, Sequence[str]] = {
    "alertname": (TASK_ALERTNAME, GAMING_ALERTNAME, CONTRADICTED_ALERTNAME, CONFIRMED_ALERTNAME),
    "state": STATES + OBSERVED_STATES}
# What silences see: every alert the outbox holds, operator alerts included.
SILENCED_VALUES: Mapping[str, Sequence[str]] = {
    "alertname": (TASK_ALERTNAME, GAMING_ALERTNAME, META_ALERTNAME, CONTRADICTED_ALERTNAME, CONFIRMED_ALERTNAME,
                  MISCALIBRATED_ALERTNAME),
    "state": STATES + OBSERVED_STATES + OPERATOR_STATES}


def never_matches(matcher: Matcher, closed: Mapping[str, Sequence[str]]) -> str | None:
    """Why `matcher` can match no alert (None when it can, or its label is not a closed set).

    `state="firing"` matches no state; `state=~"fire.*"` no state either; `alertname!~".*"`
    excludes every alertname.
    """
    values = closed.get(matcher.name)
    if values is None or any(matcher.matches({matcher.name: v}) for v in values):
        return None
    return f"matcher {clip(str(matcher), 80)} can never match: {matcher.name} is one of {', '.join(values)}"


__all__ = ["CONFIRMED_ALERTNAME", "CONTRADICTED_ALERTNAME", "MISCALIBRATED_ALERTNAME", "OBSERVED_STATES",
           "GAMING_ALERTNAME", "META_ALERTNAME", "OPERATOR_STATES", "ROUTED_VALUES", "SILENCED_VALUES",
           "STATES", "TASK_ALERTNAME", "never_matches"]
