"""The daemon's jobs, one module each, in the order a checkpoint meets them: poll, gate, score,
evaluate, observe, dispatch, report, prune (docs/architecture.md, "The jobs").

Each job is a reconciler: it claims work from the state (rows in a status, leases that expired),
does it through the stage packages' logic (`monitor.hub`, `monitor.scoring`, `monitor.alerts`,
`monitor.reports`) and records the result, so a run that is killed at any instant is simply run
again. The daemon (`monitor.service.daemon`) only schedules them; each job declares, as a small
`typing.Protocol`, the part of the store it uses, and no job imports another
(`[tool.importlinter]` in pyproject.toml). What a job needs of the daemon that runs it
(its settings, policies, stores, the Hub client) is `monitor.jobs.context.JobContext`.
"""
