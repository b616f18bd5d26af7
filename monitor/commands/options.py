"""Numeric and enumerated flags shared by the commands, checked when the command line is parsed,
and the command-line errors every command raises.

`int_option` (and `int_argument`) build typer parameters whose parser (`bounded_int`, run by
typer as it parses) refuses out-of-range integers with one line naming the flag and the
allowed range (``Invalid value for '--n-boot': 0 is not allowed; give an integer from 2 to
100,000``), before any work starts; `float_option` does the same for finite numbers. The
range is appended to the help text, so `--help` shows it too. `seconds` and `size_bytes` do
the same for durations (`15m`) and sizes (`16G`), with the parsers of the daemon's settings
(`monitor.service.settings`). `DType` and `Device` are the choices of `--dtype` and
`--device`; `device_option` also takes `cuda:N`. `STATE_OPTION` and `DB_OPTION` say where the
state is: `--state DIR` in every command that reads or writes it, `--db FILE` to name the
database file itself (`db_file` resolves the pair). `JSON_OPTION` (or `json_option(help)`),
`NOW_OPTION` and `POLICY_NAME_OPTION` are the other flags the commands share. `show_flags_as_flags` keeps `--help` from
giving boolean flags a value type (`--json <bool>`), and `id_column` adds a table column whose
long identifiers wrap instead of being cut.

Errors: `CommandLineError` (a usage error, exit code 2) and its `OptionError` (a bad value of
one flag, or of a setting from the environment or a config file) are the only command-line
errors the commands raise; both are typer's own usage errors, so typer and `monitor.cli`
print them alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer

try:  # typer >= 0.20 vendors click: its exceptions are the ones its commands raise
    from typer._click.exceptions import UsageError as _UsageError
except ImportError:  # pragma: no cover - older typer uses click itself
    from click.exceptions import UsageError as _UsageError  # type: ignore[assignment]

# Constants only: every command's --help is built from this module, and must not import the
# stages (the daemon's settings, the store, scoring) that use the same values.
from monitor.constants import DB_NAME, DEVICE_PATTERN, DTYPE_CHOICES, MAX_BATCH, MAX_LIMIT, MAX_RESAMPLES

# Where a loop or an allocation scales with a count, its upper bound keeps a typo (an extra
# zero or three) from turning into hours of work or gigabytes of memory.
MAX_ROWS = MAX_LIMIT          # --limit of the listing commands: what the daemon's API accepts
MAX_SEED = 2**32 - 1          # numpy's legacy seeding takes 32-bit seeds
MAX_ID = 2**63 - 1            # DuckDB BIGINT


class CommandLineError(_UsageError):
    """Root of every command-line error a command raises: one line on stderr, exit code 2
    (`monitor.cli` catches typer's usage errors, this one included)."""


class OptionError(typer.BadParameter, CommandLineError):
    """A bad value of one flag or argument (or of a setting from the environment or a config
    file): 'Invalid value for <where>: <what to give instead>'."""


def bounded_int(low: int | None, high: int | None) -> Callable[[Any], int]:
    """typer's parser of an integer option that must lie in [low, high]: the check runs as
    typer parses the value, and the refusal (an OptionError, which typer passes on with the
    flag's name) reads `0 is not allowed; give an integer from 1 to 256` (typer's own min/max
    would say only "Input should be greater than or equal to 1")."""
    allowed = describe_range(low=low, high=high, integer=True)

    def parse(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                raise OptionError(f"{value!r} is not an integer; give {allowed}") from None
        if (low is not None and number < low) or (high is not None and number > high):
            raise OptionError(f"{_show(number)} is not allowed; give {allowed}")
        return number

    return parse


STATE_OPTION = typer.Option(Path("state"), "--state", help="State directory (database, lock, API info).")
DB_OPTION = typer.Option(None, "--db", help=f"DuckDB state file (default: STATE/{DB_NAME}).")
# The flags many commands share, defined once so their spelling and help read alike everywhere.
JSON_OPTION = typer.Option(False, "--json", help="Print JSON.")
NOW_OPTION = typer.Option(None, "--now", help="Act as if it were this time (ISO 8601; replays and tests).")
POLICY_NAME_OPTION = typer.Option(None, "--policy", help="Only this policy (by name).")


def json_option(help: str) -> Any:
    """`--json` with a help text that says what is printed (`JSON_OPTION` says "Print JSON.")."""
    return typer.Option(False, "--json", help=help)


def db_file(state: Path, db: Path | None) -> Path:
    """The database a command uses: `--db` when given, else the one in `--state`."""
    return Path(db) if db is not None else Path(state) / DB_NAME


def show_flags_as_flags() -> None:
    """Make `--help` show boolean flags bare (`--json`), not as options taking a value.

    typer's rich help prints every option's value type, flags included (`--json <bool>`), though
    a flag takes no value; this drops the type of flags (and of `--help`) in every command.
    """
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_flags_bare", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) and not getattr(self, "count", False):
            return None
        return shown(self, ctx)

    display_type_rich._flags_bare = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def add_columns(table: Any, headers: Sequence[str], *, ids: Collection[str] = (),
                right: Collection[str] = (), names: Collection[str] = (), whole: Collection[str] = ()) -> None:
    """Add `headers` in order: those in `names` as model-name columns
    (`monitor.commands.terminal.name_column`), those in `whole` kept on one line the same way
    (ids a user copies, times), those in `ids` as identifier columns (`id_column`), those in
    `right` right-justified, the rest left-justified. No column cuts a value to `…`: a word
    too long for its column folds onto the next line (print with `print_table`, which keeps
    the `names` and `whole` columns whole by wrapping the others first)."""
    from monitor.commands.terminal import name_column

    for header in headers:
        if header in names or header in whole:
            name_column(table, header, justify="right" if header in right else "left")
        elif header in ids:
            id_column(table, header)
        else:
            table.add_column(header, justify="right" if header in right else "left", overflow="fold")


def id_column(table: Any, header: str, **kwargs: Any) -> None:
    """A column of identifiers (repo ids, lineages, shas, paths): a value too long for the
    terminal wraps onto the next line whole instead of being cut to `demo…`."""
    kwargs.setdefault("min_width", max(len(word) for word in header.split()))  # the header wraps by words only
    table.add_column(header, overflow="fold", no_wrap=False, **kwargs)


# --dtype's choices: those of `monitor.scoring.precision` (one list for every command).
DType = Enum("DType", {name: name for name in DTYPE_CHOICES}, type=str)  # type: ignore[misc]


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def _check_device(value: str | None) -> str | None:
    if value is not None and not DEVICE_PATTERN.fullmatch(value):
        raise OptionError(f"{value!r} is not allowed; give auto, cpu, cuda or cuda:N")
    return value


def device_option(help: str = "auto, cpu, cuda or cuda:N.") -> Any:
    """`--device`: auto, cpu, cuda or cuda:N (checked when parsed; availability when used)."""
    return typer.Option("auto", "--device", callback=_check_device, help=help)


MAX_ENDPOINT_CHARS = 2048


def check_endpoint(value: str | None) -> str | None:
    """A Hub endpoint as `--endpoint` takes it: an http(s) URL with a host and, if any, a port
    in 1..65535 (a malformed one otherwise stops deep in the HTTP client with a traceback)."""
    if value is None:
        return None
    shown = value if len(value) <= 80 else value[:80] + "…"
    why = None
    try:
        parts = urlsplit(value)
        port = parts.port   # raises ValueError for a port that is not a number in range
    except ValueError as exc:
        why, port = str(exc), None
    if why is None and (len(value) > MAX_ENDPOINT_CHARS or parts.scheme not in ("http", "https")
                        or not parts.hostname or port == 0 or any(ord(c) < 33 for c in value)):
        why = "not an http(s) URL with a host"
    if why is not None:
        raise OptionError(f"{shown!r} is not a Hub endpoint ({why}); give a URL such as http://127.0.0.1:8080 "
                          "or https://huggingface.co")
    return value


def endpoint_option(help: str) -> Any:
    """`--endpoint`: a Hub URL, checked when parsed (`check_endpoint`)."""
    return typer.Option(None, "--endpoint", callback=check_endpoint, help=help)


def _fmt(bound: float, integer: bool) -> str:
    return f"{int(bound):,}" if integer else f"{bound:g}"


def describe_range(*, low: float | None = None, high: float | None = None, low_open: bool = False,
                   high_open: bool = False, integer: bool = False) -> str:
    """The allowed values in words: 'an integer from 1 to 4,096', 'a number > 0 and < 1'."""
    kind = "an integer" if integer else "a finite number" if low is None and high is None else "a number"
    if low is not None and high is not None and not low_open and not high_open:
        return f"{kind} from {_fmt(low, integer)} to {_fmt(high, integer)}"
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '≥'} {_fmt(low, integer)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '≤'} {_fmt(high, integer)}")
    return " ".join([kind, " and ".join(parts)]) if parts else kind


def in_range(*, low: float | None = None, high: float | None = None, low_open: bool = False,
             high_open: bool = False, integer: bool = False) -> Callable[[Any], Any]:
    """A typer callback that passes None and in-range finite values through, and refuses the rest."""
    allowed = describe_range(low=low, high=high, low_open=low_open, high_open=high_open, integer=integer)

    def check(value: Any) -> Any:
        if value is None:
            return value
        ok = not isinstance(value, float) or math.isfinite(value)  # ints: any size compares
        if ok and low is not None:
            ok = value > low if low_open else value >= low
        if ok and high is not None:
            ok = value < high if high_open else value <= high
        if not ok:
            raise OptionError(f"{_show(value)} is not allowed; give {allowed}")
        return value

    return check


def _show(value: Any) -> str:
    # A 5,000-digit integer neither fits on a line nor converts to text (Python's digit limit).
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a {value.bit_length() * 30103 // 100000 + 1}-digit {'negative ' if value < 0 else ''}number"
    return str(value)


def _help(text: str | None, allowed: str) -> str:
    # Parentheses, not brackets: typer renders help through rich, which eats [markup].
    return f"{text + ' ' if text else ''}({allowed.removeprefix('a ').removeprefix('an ')})"


def int_option(default: Any, *names: str, low: int | None = 1, high: int | None = None,
               help: str | None = None, **kwargs: Any) -> Any:
    """An integer option that must lie in [low, high] (default: a count, at least 1)."""
    allowed = describe_range(low=low, high=high, integer=True)
    return typer.Option(default, *names, parser=bounded_int(low, high), help=_help(help, allowed), **kwargs)


def int_argument(default: Any, *, low: int | None = 1, high: int | None = None,
                 help: str | None = None, **kwargs: Any) -> Any:
    """An integer argument that must lie in [low, high]."""
    allowed = describe_range(low=low, high=high, integer=True)
    return typer.Argument(default, parser=bounded_int(low, high), help=_help(help, allowed), **kwargs)


def float_option(default: Any, *names: str, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, help: str | None = None,
                 **kwargs: Any) -> Any:
    """A finite number option within the given bounds (NaN and ±inf are always refused)."""
    bounds = {"low": low, "high": high, "low_open": low_open, "high_open": high_open}
    return typer.Option(default, *names, callback=in_range(**bounds), help=_help(help, describe_range(**bounds)),
                        **kwargs)


def seconds(value: str, flag: str, *, low: float = 1.0) -> float:
    """A duration flag (`30s`, `15m`, `1h30m`) in seconds, at least `low` (at most 100 years)."""
    from monitor.service.settings import parse_seconds   # the daemon's parser, loaded when a value is parsed

    try:
        return parse_seconds(value, low=low)
    except ValueError as exc:
        raise OptionError(str(exc), param_hint=f"'{flag}'") from None


def size_bytes(value: str | None, flag: str, *, low: int, high: int) -> int | None:
    """A size flag (`512M`, `16G`, `1.5T`, or bytes) in bytes, within [low, high]."""
    if value is None:
        return None
    from monitor.service.settings import parse_size

    try:
        return parse_size(value, low=low, high=high)
    except ValueError as exc:
        raise OptionError(str(exc), param_hint=f"'{flag}'") from None


__all__ = ["is_hub_model", "CommandLineError", "OptionError", "bounded_int", "DType", "Device", "device_option", "show_flags_as_flags", "id_column", "db_file", "describe_range",
           "in_range", "int_option", "int_argument", "float_option", "seconds", "size_bytes", "MAX_ROWS",
           "MAX_RESAMPLES", "MAX_BATCH", "MAX_SEED", "MAX_ID"]


def is_hub_model(model: str) -> bool:
    """Whether `model` is fetched from the Hub (as the loader decides: an existing folder wins)."""
    from monitor.scoring.loader import parse_hub_ref

    return not Path(model).expanduser().exists() and parse_hub_ref(model) is not None
