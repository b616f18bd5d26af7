"""`lstar calibrate`: build task curves from reference checkpoints in one resumable run.

`campaign` reads the campaign file, `plan` lists its jobs and which are done, `evaluate`
runs the tasks on a loaded checkpoint, `runner` drives the jobs, `outputs` fits,
validates and writes the curves and the validation report, and `manifest` records what a
campaign wrote so that a later run removes only its own stale curves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from monitor.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from monitor.calibrate.campaign import Campaign, load_campaign, parse_campaign
    from monitor.calibrate.outputs import CampaignOutputs, CurveOutcome
    from monitor.calibrate.plan import Plan, build_plan
    from monitor.calibrate.runner import CampaignResult, JobFailure, run_campaign

# Re-exported lazily: importing the package (or one light module in it, which imports the
# package first) does not import every stage module and their libraries; a name loads its
# module when first used.
_EXPORTS = {  # name: the module that defines it, imported on first use
    "Campaign": "monitor.calibrate.campaign",
    "load_campaign": "monitor.calibrate.campaign",
    "parse_campaign": "monitor.calibrate.campaign",
    "CampaignOutputs": "monitor.calibrate.outputs",
    "CurveOutcome": "monitor.calibrate.outputs",
    "Plan": "monitor.calibrate.plan",
    "build_plan": "monitor.calibrate.plan",
    "CampaignResult": "monitor.calibrate.runner",
    "JobFailure": "monitor.calibrate.runner",
    "run_campaign": "monitor.calibrate.runner",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = ["Campaign", "CampaignOutputs", "CampaignResult", "CurveOutcome", "JobFailure", "Plan", "build_plan",
           "load_campaign", "parse_campaign", "run_campaign"]
