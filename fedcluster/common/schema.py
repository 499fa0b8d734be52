"""The table schema: the one agreed description of a hospital table's columns.

The coordinator publishes a schema file (TOML or JSON) and every site holds a copy; a
run names it, and its hash (:func:`schema_hash`) is compared in the describe round, so
every site encodes its table the same way. Per column: its name and accepted aliases,
its type, unit and conversions from other declared units, allowed range, and what to
do with a missing cell. Both sides use it: a site to encode its file, the model to
encode a raw table for ``predict`` (hence ``common``).

Example (TOML)::

    missing = "impute-mean"          # the table's default policy

    [[columns]]
    name = "patient_id"
    type = "id"

    [[columns]]
    name = "glucose"
    aliases = ["glu", "blood_glucose"]
    type = "numeric"
    unit = "mg/dL"
    units = { "mmol/L" = 18.016 }    # a value in mmol/L times 18.016 is in mg/dL
    range = [10, 1000]
    out-of-range = "error"           # or "clip"

    [[columns]]
    name = "smoking"
    type = "categorical"
    categories = ["never", "former", "current", "unknown"]
    other = "unknown"                # an unlisted value maps here instead of an error
    missing = "impute-mean"          # the pooled share of each level
    missing-indicator = true         # adds a 0/1 column "smoking missing"

A site whose file holds a column in another declared unit says so in the header
(``glucose [mmol/L]`` or ``glucose (mmol/L)``) or in its node config. A table whose rows
carry their own units (an OMOP cohort: each measurement's ``unit_concept_id``) names the
column that holds them: ``unit-column = "glucose_unit"``; each row's value is converted
by its own unit, and a row in a unit the column does not convert is an error naming it.

Errors: :class:`SchemaError` (the schema file itself; the message names the key) and
``SiteDataError`` (a table that does not fit; the message names file, row, column and
value): ``client_app/table_schema.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: The bins of an impute-median histogram unless the schema says (``median-bins``).
DEFAULT_MEDIAN_BINS = 200
MISSING_POLICIES = ("error", "drop-row", "impute-mean", "impute-median")
MissingPolicy = Literal["error", "drop-row", "impute-mean", "impute-median"]
#: Cells read as missing in a CSV file (after stripping spaces).
MISSING_TOKENS = ("", "NA", "N/A", "NaN", "nan", "NULL", "null", "None", ".")


class SchemaError(ValueError):
    """A schema file that is unreadable or invalid; the message names the file and key."""


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class _Strict(BaseModel):
    model_config = ConfigDict(alias_generator=_kebab, populate_by_name=True, extra="forbid",
                              frozen=True)


class Column(_Strict):
    """One column of the agreed table.

    ``type``: ``numeric`` (a feature), ``categorical`` (a feature, one-hot encoded against
    ``categories``), ``id`` (dropped before anything else), ``label`` (kept at the site for
    evaluation), ``ignore`` (dropped). ``units`` maps each other accepted unit to the factor
    (and ``unit-offsets`` the offset) that takes a value in it to ``unit``:
    value_in_unit = value * factor + offset. ``unit-column``: the table column that names
    each row's unit (its cells: ``unit`` or a key of ``units``; an empty cell beside a
    value is an error), for tables whose rows are in mixed units. ``category-weight``: the value of a one-hot
    column's 1 (default 1: two rows in different levels are at squared distance 2, the
    expected squared distance of two random rows on a standardised numeric column,
    whatever the number of levels).
    """

    name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    type: Literal["numeric", "categorical", "id", "label", "ignore"] = "numeric"
    unit: str | None = None
    units: dict[str, float] = {}
    unit_offsets: dict[str, float] = {}
    unit_column: str | None = None
    range: tuple[float, float] | None = None
    out_of_range: Literal["error", "clip"] = "error"
    categories: tuple[str, ...] = ()
    other: str | None = None
    missing: MissingPolicy | None = None
    missing_indicator: bool = False
    category_weight: float = Field(1.0, gt=0.0)

    @model_validator(mode="after")
    def _consistent(self) -> "Column":
        where = f"column {self.name!r}"
        if self.type == "categorical":
            if not self.categories:
                raise ValueError(f"{where}: a categorical column needs its list of categories")
            if len(set(self.categories)) != len(self.categories):
                raise ValueError(f"{where}: categories repeat a level")
            if self.other is not None and self.other not in self.categories:
                raise ValueError(f"{where}: other {self.other!r} is not one of its categories")
            if self.missing == "impute-median":
                raise ValueError(f"{where}: a category has no median; use impute-mean (the "
                                 "pooled share of each level), drop-row or error")
        elif self.categories or self.other is not None:
            raise ValueError(f"{where}: categories and other are for categorical columns")
        if self.type != "numeric" and (self.units or self.range is not None or self.unit):
            raise ValueError(f"{where}: unit, units and range are for numeric columns")
        if self.type != "numeric" and self.unit_column is not None:
            raise ValueError(f"{where}: unit-column is for numeric columns")
        if self.unit_column is not None and self.unit is None:
            raise ValueError(f"{where}: unit-column names each row's unit, so the column "
                             "needs the unit it converts to (unit)")
        if self.units and self.unit is None:
            raise ValueError(f"{where}: units converts to unit, which is not given")
        for unit, factor in self.units.items():
            if not factor or factor != factor or abs(factor) == float("inf"):
                raise ValueError(f"{where}: units {unit!r}: the factor must be finite and not 0")
        if set(self.unit_offsets) - set(self.units):
            raise ValueError(f"{where}: unit-offsets names a unit that units does not")
        if self.range is not None and not self.range[0] < self.range[1]:
            raise ValueError(f"{where}: range must be [low, high] with low < high")
        if self.type not in ("numeric", "categorical") and (self.missing or self.missing_indicator):
            raise ValueError(f"{where}: missing and missing-indicator are for feature columns")
        return self

    @property
    def is_feature(self) -> bool:
        return self.type in ("numeric", "categorical")


class Schema(_Strict):
    """The agreed table: its columns, and the missing-value policy of every feature column
    that does not set its own (``missing``, default ``error``)."""

    columns: tuple[Column, ...] = Field(min_length=1)
    missing: MissingPolicy = "error"
    #: The cell texts read as missing (after stripping spaces; None: :data:`MISSING_TOKENS`).
    missing_tokens: tuple[str, ...] | None = None
    #: The bins of an impute-median column's histogram over its range (``imputation.py``).
    median_bins: int = Field(DEFAULT_MEDIAN_BINS, ge=2, le=100_000)

    @property
    def missing_cells(self) -> frozenset[str]:
        """The cell texts this schema reads as missing (``missing-tokens``, else
        :data:`MISSING_TOKENS`); an empty cell always is."""
        tokens = MISSING_TOKENS if self.missing_tokens is None else self.missing_tokens
        return frozenset(tokens) | {""}

    @model_validator(mode="after")
    def _unique(self) -> "Schema":
        seen: dict[str, str] = {}
        for column in self.columns:
            for name in (column.name, *column.aliases):
                key = normalise(name)
                if key in seen:
                    raise ValueError(f"the name {name!r} is used by columns {seen[key]!r} and "
                                     f"{column.name!r}")
                seen[key] = column.name
        for column in self.columns:
            if column.unit_column is not None and normalise(column.unit_column) in seen:
                raise ValueError(f"column {column.name!r}: unit-column "
                                 f"{column.unit_column!r} is a column of the schema; it names "
                                 "the table column that holds each row's unit")
        if sum(c.type == "label" for c in self.columns) > 1:
            raise ValueError("more than one column has type 'label'")
        if not any(c.is_feature for c in self.columns):
            raise ValueError("no column is numeric or categorical: nothing to cluster")
        for column in self.features:
            if self.policy(column) == "impute-median" and column.type == "categorical":
                raise ValueError(f"column {column.name!r}: a category has no median; give it "
                                 "missing = \"impute-mean\" (the pooled share of each level)")
            if self.policy(column) == "impute-median" and column.range is None:
                raise ValueError(f"column {column.name!r}: impute-median needs the column's "
                                 "range (its histogram's bins span it)")
        return self

    def policy(self, column: Column) -> str:
        """The missing-value policy of a feature column (its own, else the table's)."""
        return column.missing or self.missing

    @property
    def features(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_feature)

    def feature_names(self) -> list[str]:
        """The encoded features, in order: a numeric column, each level of a category
        (``name=level``), and after each feature its indicator (``name missing``)."""
        names: list[str] = []
        for column in self.features:
            if column.type == "numeric":
                names.append(column.name)
            else:
                names.extend(f"{column.name}={level}" for level in column.categories)
            if column.missing_indicator:
                names.append(f"{column.name} missing")
        return names


def encoded_kinds(schema: "Schema") -> list[str]:
    """Per encoded feature (``feature_names`` order): ``numeric``, ``level`` (a category's
    0/1 column) or ``indicator`` (a missing-indicator's)."""
    kinds: list[str] = []
    for column in schema.features:
        kinds += ["numeric"] if column.type == "numeric" else ["level"] * len(column.categories)
        if column.missing_indicator:
            kinds.append("indicator")
    return kinds


def parse_units(items, where: str = "units") -> dict[str, str]:
    """``["glucose=mmol/L", ...]`` (a site's declared units: node config ``units``, the
    CLI's ``--units``) as {column: unit}; ValueError naming the bad item."""
    units = {}
    for item in items:
        name, sep, unit = str(item).partition("=")
        if not sep or not name.strip() or not unit.strip():
            raise ValueError(f"{where} {item!r}: write COLUMN=UNIT, e.g. glucose=mmol/L")
        units[name.strip()] = unit.strip()
    return units


def normalise(name: str) -> str:
    """Header names match case- and space-insensitively."""
    return " ".join(str(name).split()).casefold()


_UNIT_SUFFIX = re.compile(r"^(?P<name>.*?)\s*[\[(](?P<unit>[^\[\]()]+)[\])]\s*$")


def split_unit(header: str) -> tuple[str, str | None]:
    """``"glucose [mmol/L]"`` -> (``"glucose"``, ``"mmol/L"``); no suffix -> (header, None)."""
    match = _UNIT_SUFFIX.match(str(header))
    if match and match.group("name"):
        return match.group("name"), match.group("unit").strip()
    return str(header), None


def _errors(err: ValidationError) -> str:
    parts = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"]) or "schema"
        parts.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def parse_schema(data: dict, source: str = "schema") -> Schema:
    """A :class:`Schema` from already-parsed TOML/JSON; :class:`SchemaError` names the key."""
    try:
        return Schema.model_validate(data)
    except ValidationError as err:
        raise SchemaError(f"{source}: {_errors(err)}") from None


def load_schema(path: str | Path) -> Schema:
    """Read a schema file (``.toml`` or ``.json``)."""
    path = Path(path)
    kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
    if path.suffix.lower() not in (".json", ".toml", ""):
        raise SchemaError(f"{path}: a schema file is .toml or .json, not "
                          f"{path.suffix.lower()!r} (is this the data file?)")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SchemaError(f"{path}: cannot read the schema file ({err.strerror})") from None
    try:
        data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as err:
        raise SchemaError(f"{path}: not valid {kind} ({err})") from None
    return parse_schema(data, str(path))


def schema_hash(schema: Schema) -> str:
    """sha256 of the schema's canonical JSON (the validated content, not the file's
    layout): two sites agree exactly when their hashes are equal."""
    content = schema.model_dump(mode="json", by_alias=True)
    # keys added later hash, when a schema does not use them, as before they were
    if content.get("missing-tokens") is None:
        content.pop("missing-tokens", None)
    for column in content["columns"]:
        if column.get("unit-column") is None:
            column.pop("unit-column", None)
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int) -> tuple[Schema, str]:
    schema = load_schema(path)
    return schema, schema_hash(schema)


def run_schema(path: str) -> tuple[Schema, str] | None:
    """The run's schema and its hash (run config ``schema``; None when it names none),
    read once per file version (the server asks every round)."""
    if not path:
        return None
    try:
        stat = Path(path).stat()
    except OSError as err:
        raise SchemaError(f"{path}: cannot read the run's schema file ({err.strerror})") from None
    return _load_cached(str(path), stat.st_mtime_ns, stat.st_size)
