"""`monitor.training_order.place` in SQL, for the inputs on which the two agree exactly.

A report orders every scored checkpoint of every lineage it shows; placing 10^5 checkpoints in
Python (a regex over the refs, ISO times parsed, a `Placement` each) was most of a report's
time at 10^5. DuckDB computes the same step and time here, in its own engine, for the inputs
whose meaning is the same in both:

- the refs are a JSON array of ASCII strings with no run of 19 or more digits (Python's `\\d`
  and case folding reach beyond ASCII, and its integers beyond 64 bits);
- each time the meta gives (`gate.commit_date`, `listing.last_modified`) is absent, not a
  string, empty, or `YYYY-MM-DDTHH:MM:SS[.ffffff][Z|±HH:MM]` with a year after 0000 (the form the
  Hub writes; Python's `fromisoformat` accepts more, DuckDB's cast other things).

Every other row is flagged (`canonical` false) and placed by `training_order.place` itself, so
the order a report shows never depends on which engine placed a checkpoint
(`tests/test_placement_sql.py` compares the two over hand-written and generated hostile inputs).
The SQL text comes from `monitor.training_order` (the step pattern is STEP_PATTERN's, rewritten
for RE2, which has no look-behind).

One reading is DuckDB's on both sides: a meta holding a key twice gives the first value to
DuckDB's `json_extract` and the last to Python's `json.loads`. Every reader that places a
checkpoint (the report, the alert engine, a policy change's re-evaluation, the watchlist and the
status page) reads the two placing values DuckDB extracted when the meta was written
(`monitor.store.placing`), and the Python path re-places from those values, so every path reads
the same one. No writer of this project writes a key twice (metas are `json.dumps` of dicts).
"""

from __future__ import annotations

# STEP_PATTERN `(?<![a-z0-9])(?:step|checkpoint|ckpt)[-_]?(\d+)(?![0-9])`, case-insensitive: the
# look-behind becomes a consumed boundary (start, or a character that is not a letter or digit);
# on ASCII text `\d+` is `[0-9]+`, greedy, so the look-ahead always holds.
STEP_RE2 = r"(?i)(?:^|[^a-z0-9])(?:step|checkpoint|ckpt)[-_]?([0-9]+)"
ISO_TIME_RE2 = (r"[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
                r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?")
# a ref Python and DuckDB might read differently: a character beyond ASCII (or NUL), or a
# number too long for a 64-bit integer
_UNSAFE_REF_RE2 = r"[^\x01-\x7f]|[0-9]{19}"


def _text(value: str) -> str:
    return f"json_extract_string({value}, '$')"


def time_sql(value: str) -> str:
    """The time a JSON value names, as TIMESTAMPTZ (NULL when it names none): a string with no
    offset is UTC, as `training_order._parse_time` reads it; an impossible date is NULL there
    and here (`try_cast`)."""
    text = _text(value)
    return (f"(CASE WHEN json_type({value}) = 'VARCHAR' AND {text} <> '' THEN try_cast(CASE "
            f"WHEN {text} LIKE '%Z' THEN {text}[:-2] || '+00:00' "
            f"WHEN regexp_matches({text}, '[+-][0-9]{{2}}:[0-9]{{2}}$') THEN {text} "
            f"ELSE {text} || '+00:00' END AS TIMESTAMPTZ) END)")


def time_is_canonical_sql(value: str) -> str:
    """Whether `time_sql(value)` is what Python reads from it."""
    text = _text(value)
    return (f"(json_type({value}) IS DISTINCT FROM 'VARCHAR' OR {text} = '' "
            f"OR (regexp_full_match({text}, '{ISO_TIME_RE2}') AND {text}[:4] <> '0000'))")


def refs_list_sql(refs: str) -> str:
    """A refs JSON column as a list of strings (NULL when it is not an array)."""
    return f"(CASE WHEN json_type({refs}) = 'ARRAY' THEN json_extract_string({refs}, '$[*]') END)"


def refs_are_canonical_sql(refs: str) -> str:
    """Whether `step_sql` reads from `refs` what `training_order.parse_step` reads: absent or
    null, or an array of ASCII strings without a 19-digit run."""
    return (f"(CASE WHEN json_type({refs}) = 'ARRAY' THEN "
            f"coalesce(list_bool_and(list_transform(json_extract({refs}, '$[*]'), "
            f"lambda x: json_type(x) = 'VARCHAR' AND NOT regexp_matches(json_extract_string(x, '$'), "
            f"'{_UNSAFE_REF_RE2}'))), true) "
            f"ELSE coalesce(json_type({refs}), 'NULL') = 'NULL' END)")


def step_sql(refs_list: str) -> str:
    """The training step a list of refs names (the largest), or NULL (`parse_step`)."""
    return (f"list_max(list_transform({refs_list}, lambda x: "
            f"try_cast(nullif(regexp_extract(x, '{STEP_RE2}', 1), '') AS BIGINT)))")


def placed_time_sql(refs_list: str, placed: str, discovered_at: str, scored_at: str) -> str:
    """A checkpoint's release time (`training_order.place`): the gate's commit date, else the
    listing's last-modified when the checkpoint is the `main` head, else first seen, else scored.
    `placed` is the list of the two meta values (`checkpoints.placing_values`)."""
    return (f"coalesce({time_sql(f'{placed}[1]')}, CASE WHEN {refs_list} = ['main'] THEN "
            f"{time_sql(f'{placed}[2]')} END, {discovered_at}, {scored_at})")


def canonical_sql(refs: str, placed: str) -> str:
    """Whether the SQL placement of a row equals Python's (else Python places it)."""
    return (f"({refs_are_canonical_sql(refs)} AND {time_is_canonical_sql(f'{placed}[1]')} "
            f"AND {time_is_canonical_sql(f'{placed}[2]')})")


__all__ = ["ISO_TIME_RE2", "STEP_RE2", "canonical_sql", "placed_time_sql", "refs_are_canonical_sql",
           "refs_list_sql", "step_sql", "time_is_canonical_sql", "time_sql"]
