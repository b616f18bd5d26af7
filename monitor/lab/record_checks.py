"""What every version of `lab.json` checks the same way, in one place.

Versions 1 and 2 (`monitor.lab.records`) and 3 (`monitor.lab.records_v3`) each keep their own
schema: their fields, their bounds and the wording of their errors. What they share is here:

- `StrictModel`, the pydantic base that refuses unknown keys and NaN/±inf in every float;
- `LabRecordBase`, the top level of a record: the `schema` key (checked against the version's
  `SCHEMA`), the run's `config`, `family_names` and `to_json` (schema first, stable key order);
- `validate_record`, which turns pydantic's refusal into one `LabError` line naming the file
  and the first key at fault;
- the cross-field checks a record's `model_validator` composes: families listed once, every
  row of a listed family, each lineage key once, no lossy family in the primary race.

The checks raise ValueError, which pydantic reports as the record's first error, so each
version's messages read as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from monitor.errors import LabError

__all__ = ["LabRecordBase", "StrictModel", "check_checkpoints", "check_families_once", "check_listed_family",
           "check_primary_is_lossless", "first_error", "validate_record"]

Record = TypeVar("Record", bound="LabRecordBase")


class StrictModel(BaseModel):
    # allow_inf_nan=False: NaN and ±inf (which Python's JSON reader accepts) are refused in
    # every float field, naming it.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class LabRecordBase(StrictModel):
    """The top level every version of `lab.json` shares; a version sets `SCHEMA` and adds its
    fields (after `schema` and `config`, so the written key order is the file's)."""

    SCHEMA: ClassVar[str]
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    schema_: str = Field(alias="schema")
    config: dict[str, Any]

    @field_validator("schema_")
    @classmethod
    def _schema(cls, value: str) -> str:
        if value != cls.SCHEMA:
            raise ValueError(f"schema must be {cls.SCHEMA!r}, got {value!r}")
        return value

    def family_names(self) -> list[str]:
        """Family names in the file's order."""
        return [f.family for f in self.families]  # type: ignore[attr-defined]

    def to_json(self) -> str:
        """The file's text (schema first, stable key order)."""
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=1) + "\n"


def first_error(exc: ValidationError) -> str:
    """pydantic's first complaint as `key.path: message` (an unknown key named as such), with how
    many more there are."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
    text = f"unknown key {where!r}" if err.get("type") == "extra_forbidden" else f"{where}: {err.get('msg', 'invalid')}"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return text + more


def validate_record(model: type[Record], data: Any, *, where: str, hint: str) -> Record:
    """`data` as a `model` record, or one LabError line naming `where` and the first problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise LabError(f"{where} is not a valid {model.SCHEMA} record: {first_error(exc)}", hint=hint) from None


def check_families_once(names: Sequence[str]) -> None:
    if len(set(names)) != len(names):
        raise ValueError("a family is listed more than once in families")


def check_listed_family(where: str, family: str, names: Collection[str], *, name_known: bool = False) -> None:
    """`where` (e.g. `checkpoints[3]`) belongs to a family the record lists; `name_known` adds
    the listed ones to the message (version 1's wording)."""
    if family not in names:
        known = f" (known: {', '.join(sorted(names))})" if name_known else ""
        raise ValueError(f"{where} has family {family!r}, which families does not list{known}")


def check_checkpoints(checkpoints: Iterable[Any], names: Collection[str], *, key: Callable[[Any], Hashable],
                      describe: Callable[[Any], str], name_known: bool = False,
                      also: Callable[[int, Any], None] | None = None) -> None:
    """Each checkpoint of a listed family, checked by `also` (when given), and its lineage key
    (`key`) listed once; a repeat reads `checkpoints[i]: <describe(c)> is listed more than once`."""
    seen: set[Hashable] = set()
    for i, c in enumerate(checkpoints):
        check_listed_family(f"checkpoints[{i}]", c.family, names, name_known=name_known)
        if also is not None:
            also(i, c)
        k = key(c)
        if k in seen:
            raise ValueError(f"checkpoints[{i}]: {describe(c)} is listed more than once")
        seen.add(k)


def check_primary_is_lossless(families: Iterable[Any]) -> None:
    for f in families:
        if f.role == "primary" and not f.lossless:
            raise ValueError(f"family {f.family!r} is lossy and cannot be in the primary race")
