"""The reduced labs of the end-to-end tests on less work: fewer task items, other settings.

A reduced lab checkpoint spent most of its CPU on its two tasks: the 231 additions x 21
options and 300 cloze items x 4, each also decoded greedily (a lab v3 lineage's timing.json:
tasks 18.6-19.4 of 24-28 CPU-seconds; about 7 CPU-seconds a checkpoint). The end-to-end tests
check what the race does with the items it is given (every item scored, the options' chance
level, a record that resumes byte for byte), which holds for any number of them; they run on
every ADD_EVERY-th addition and N_CLOZE cloze items. The lab has no setting for the number of
additions: the cut replaces `addition_items` where the races build their inputs (in the
process that prepares the race; spawned workers get the items with the inputs), and the cloze
count is the reduced configs' own `n_cloze`, so lab.json records both numbers as they were.
A test may change further settings of the reduced configs the same way (`changes`), and take
every `add_every`-th addition instead.

`python tests/support/lab_cut.py ARGS` is `lstar ARGS` with the cut.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ADD_EVERY = 10      # 24 of the 231 additions
N_CLOZE = 30


def cut_items(problems: Any, *, add_every: int = ADD_EVERY) -> list[dict[str, Any]]:
    from monitor.lab.tasks import addition_items

    return addition_items(problems)[::add_every]


def replacements(*, add_every: int = ADD_EVERY, **changes: Any) -> list[tuple[Any, str, Callable[..., Any]]]:
    """(module, attribute, value) for each replacement the cut makes; `changes` are further
    settings of both reduced configs."""
    import monitor.lab.config
    import monitor.lab.race
    import monitor.lab.race_v3

    settings = {"n_cloze": N_CLOZE, **changes}
    items = functools.partial(cut_items, add_every=add_every)
    return [(monitor.lab.race, "addition_items", items),
            (monitor.lab.race_v3, "addition_items", items),
            (monitor.lab.config, "race_reduced_config",
             functools.partial(monitor.lab.config.race_reduced_config, **settings)),
            (monitor.lab.config, "race_v3_reduced_config",
             functools.partial(monitor.lab.config.race_v3_reduced_config, **settings))]


def cut_lab(setattr_: Callable[[Any, str, Any], None] = setattr, *, add_every: int = ADD_EVERY,
            **changes: Any) -> None:
    """Make the cut in this process (`monkeypatch.setattr` to have it undone after a test)."""
    for module, name, value in replacements(add_every=add_every, **changes):
        setattr_(module, name, value)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))    # this checkout's package, as `-m` from its root
    cut_lab()
    from monitor.cli import main

    sys.exit(main(sys.argv[1:]))
