"""The "how to read this" note under each section of a report, the same in Markdown and HTML.

Each note says what the numbers are measured in and which direction is good, so a reader
who has not seen docs/measurement.md can still read the table under it.
"""

from __future__ import annotations

HOW_TO_READ: dict[str, str] = {
    "lstar": (
        "L* is the model's cross-entropy on the pinned corpus minus that of a unigram model over the "
        "same tokens (CE − CE_uni), in nats per token. Subtracting the unigram baseline makes models with "
        "different tokenizers comparable. Lower is more capable: 0 is no better than token frequencies, "
        "and each step down is structure the model has learned. SE is the bootstrap standard error over "
        "documents. Checkpoints of a lineage are listed in training order (by the step in their branch "
        "name, else by Hub commit date); the last one is the lineage's current checkpoint: the latest in "
        "training order, whatever order the checkpoints were scored in."),
    "tasks": (
        "Each task curve maps a progress axis (L* unless the task's table names another, such as bits/byte) "
        "to the task's metric. The level b + ε is the chance baseline b plus the "
        "margin ε that counts as a real capability; η̂ is the value at which the fitted curve reaches that "
        "level, with its bootstrap interval. A lineage is emerged when even the pessimistic end (lo) of "
        "its predicted interval is at or above the level, at risk when only the optimistic end (hi) is, "
        "and clear otherwise. States are those of each lineage's current checkpoint."),
    "crossings": (
        "A crossing is a change of a lineage's state (clear, at risk, emerged) for a task, as the alerts "
        "saw it when each checkpoint was scored in this period; 'new' is a lineage's first state."),
    "stability": (
        "Stability diagnostics at a fixed sample of scored positions. TCB (token constraint bound, "
        "δ = 1/‖J‖ of the softmax with respect to the final hidden state) is how far, in hidden-state "
        "units, the state can move before the next-token distribution changes noticeably: larger is more "
        "stable. Its distribution has a heavy right tail (where the model is nearly certain the softmax "
        "saturates and δ becomes very large), so the mean is much larger than the median; read the median "
        "and p10 (the least stable tenth of positions). V_eff = 1/Σ p² is the effective number of "
        "candidate tokens (1 = certain, the vocabulary size = uniform). The logit margin is the gap "
        "between the top two logits, in nats: larger is more decisive."),
    "plots": (
        "Each family (lineage) keeps one colour in every plot, named in the legends. L* over time is "
        "drawn against training step for lineages whose branches name steps and against release time "
        "(Hub commit date) otherwise; the task curves show η̂ with its interval as a shaded band."),
}


__all__ = ["HOW_TO_READ"]
