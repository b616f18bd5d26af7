"""The report's derivatives: a section per base, listing the checkpoints that declare it
(fine-tunes, adapters, quantizations) with their relation, both coordinates (L*(base), L*(θ))
and, per task, the state, the coordinate it was predicted from and whether ρ was measured."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from monitor.escape import markdown_text
from monitor.reports.present import fmt
from monitor.store import Store
from monitor.store.derivatives import pick_complete_score


def _task_states(predictions: Iterable[Any]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """Per (repo, commit), per task: the newest prediction's state and how it was made."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for p in sorted(predictions, key=lambda p: p.evaluated_at):
        derivative = (p.detail or {}).get("derivative") or {}
        rho = derivative.get("rho")
        out.setdefault((p.repo, p.commit_sha), {})[p.task] = {
            "state": p.state, "p_hat": p.p_hat, "lo": p.lo, "hi": p.hi,
            "coordinate": derivative.get("coordinate", "own"),
            "rho_measured": bool(derivative.get("rho_measured")),
            "rho": rho.get("rho") if rho else None, "rho_interval": rho.get("interval") if rho else None,
            "residual": derivative.get("residual")}
    return out


def derivative_sections(store: Store, corpus: str | None, checkpoints: Iterable[tuple[str, str]],
                        predictions: Sequence[Any], name_of: Callable[[str, str], str],
                        prefetch: Callable[[Sequence[tuple[str, str]]], None] | None = None) -> list[dict[str, Any]]:
    """One entry per base of the derivatives among `checkpoints` ((repo, commit) pairs the
    report mentions), each listing them with both coordinates on `corpus` and their states.
    `prefetch`, when given, is told every checkpoint about to be named (`name_of`) first, so
    that their refs are read in one lookup.

    Three queries whatever the number of derivatives: their lineages, their own complete
    scores, their bases' complete scores (each a batch lookup by key); and the prefetch's."""
    bases = store.hub_checkpoint_bases(sorted(set(checkpoints)))
    if not bases:
        return []
    if prefetch is not None:
        prefetch([*bases, *((b["base_repo"], b["base_sha"]) for b in bases.values() if b["base_sha"])])
    states = _task_states(p for p in predictions if (p.repo, p.commit_sha) in bases)
    owns = store.complete_scores(list(bases), corpus) if corpus else {}
    base_keys = [(b["base_repo"], b["base_sha"]) for b in bases.values() if b["base_sha"]]
    theirs_all = store.complete_scores(base_keys, corpus) if corpus and base_keys else {}
    groups: dict[tuple[str, str | None], dict[str, Any]] = {}
    for (repo, sha), base in sorted(bases.items()):
        key = (base["base_repo"] or " + ".join(base["bases"]) or "?", base["base_sha"])
        own = pick_complete_score(owns.get((repo, sha))) if corpus else None
        theirs = (pick_complete_score(theirs_all.get((base["base_repo"], base["base_sha"])), own or None)
                  if corpus and base["base_sha"] else None)
        group = groups.setdefault(key, {
            "base": key[0], "base_sha": key[1],
            "base_checkpoint": name_of(key[0], key[1]) if key[1] else key[0],
            "base_status": base["base_status"], "lstar_base": theirs["lstar"] if theirs else None,
            "lstar_base_se": theirs["se_ce"] if theirs else None, "derivatives": []})
        if group["lstar_base"] is None and theirs is not None:
            group["lstar_base"], group["lstar_base_se"] = theirs["lstar"], theirs["se_ce"]
        group["derivatives"].append({
            "repo": repo, "commit": sha, "checkpoint": name_of(repo, sha), "relation": base["relation"],
            "relation_source": base["relation_source"], "problem": base["problem"],
            "lstar_base": theirs["lstar"] if theirs else None, "lstar": own["lstar"] if own else None,
            "lstar_se": own["se_ce"] if own else None, "tasks": states.get((repo, sha), {})})
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1] or ""))]


def _state_cell(s: Mapping[str, Any]) -> str:
    text = f"{s['state']} (from {'L*(base)' if s['coordinate'] == 'base' else 'own L*'}"
    if s.get("residual"):
        text += f" + ρ̄ {s['residual']['mean']:+.3f}"
    text += f"; ρ {'= ' + format(s['rho'], '+.3f') if s['rho_measured'] and s['rho'] is not None else 'unmeasured'})"
    return text


def derivatives_markdown(sections: Sequence[Mapping[str, Any]]) -> list[str]:
    """The Markdown lines of the derivatives section (none when no checkpoint declares a base)."""
    if not sections:
        return []
    out = ["## Derivatives by base", "",
           "*How to read this:* each checkpoint that declares a base model (its card's base_model) is "
           "listed under that base, pinned to a commit, with both coordinates on the report's corpus: "
           "L*(base) and its own L*. A task state says which coordinate it was predicted from and "
           "whether the task residual ρ = P(θ) − φ(L*(base)) was measured (a stored label).", ""]
    for g in sections:
        status = f", {markdown_text(g['base_status'])}" if g.get("base_status") else ", not in the store"
        out += [f"### {markdown_text(g['base_checkpoint'])}", "",
                f"L*(base) = {fmt(g['lstar_base'])} ± {fmt(g['lstar_base_se'])}{status}.", "",
                "| derivative | relation | L*(base) | L* | task states |", "|---|---|---:|---:|---|"]
        for d in g["derivatives"]:
            tasks = "; ".join(f"{markdown_text(task)}: {_state_cell(s)}"
                              for task, s in sorted(d["tasks"].items())) or "—"
            relation = markdown_text(d["relation"]) + ("" if d["relation_source"] == "declared"
                                                       else f" ({markdown_text(d['relation_source'])})")
            out.append(f"| {markdown_text(d['checkpoint'])} | {relation} | {fmt(d['lstar_base'])} | "
                       f"{fmt(d['lstar'])} | {tasks} |")
        out.append("")
    return out
