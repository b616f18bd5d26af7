"""`lstar calibrate`: build task curves from reference checkpoints in one resumable run.

`campaign` reads the campaign file, `plan` lists its jobs and which are done, `evaluate`
runs the tasks on a loaded checkpoint, `runner` drives the jobs, `outputs` fits,
validates and writes the curves and the validation report, and `manifest` records what a
campaign wrote so that a later run removes only its own stale curves.
"""

from monitor.calibrate.campaign import Campaign, load_campaign, parse_campaign
from monitor.calibrate.outputs import CampaignOutputs, CurveOutcome
from monitor.calibrate.plan import Plan, build_plan
from monitor.calibrate.runner import CampaignResult, JobFailure, run_campaign

__all__ = ["Campaign", "CampaignOutputs", "CampaignResult", "CurveOutcome", "JobFailure", "Plan", "build_plan",
           "load_campaign", "parse_campaign", "run_campaign"]
