"""A site's own settings (``flower-supernode --node-config``), validated: its data, its
privacy floor, its policy, its ledgers. A bad key or value raises ``ConfigError`` naming
the key (the run config: ``config.py``)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_serializer, field_validator

from fedcluster.common.algorithms import ALGORITHMS
from fedcluster.common.config import ConfigError, _format, _kebab, _Strict
from fedcluster.common.schema import parse_units

__all__ = ["ConfigError", "NodeConfig", "parse_node_config"]


#: A site's ``dp-budget`` when it sets none: epsilon 10 at delta 1e-5 (rho-zCDP about
#: 1.55). What no sequence of DP tasks within it can learn of a row, and so why this
#: value: docs/reference/node-config.md. There is no unlimited budget.
DEFAULT_DP_BUDGET = (10.0, 1e-5)


class NodeConfig(_Strict):
    """A site's own settings (``flower-supernode --node-config``)."""

    model_config = ConfigDict(
        # extra="forbid": a misspelt key (a site policy above all) must not be ignored
        alias_generator=_kebab, populate_by_name=True, extra="forbid", frozen=True
    )

    data_path: str | None = None
    # A SQL database instead of a file (client_app/data/sql_source.py): a SQLAlchemy URL
    # without a password, and what to read: one SELECT (or a file holding it) or a table.
    data_url: str | None = None
    data_query: str | None = None
    data_query_file: str | None = None
    data_table: str | None = None
    # The database's password, when not in the driver's environment (PGPASSWORD, PGPASSFILE).
    data_password_file: str | None = None
    # The longest the query and the read may take, in seconds (the statement timeout).
    data_timeout: float = Field(600.0, gt=0, description="seconds the database read may take")
    label_column: str | None = None
    # The site's own privacy floor p_site: the fewest rows of a group it answers from
    # (client_app/site_groups.py) and of a cluster it reports; 1 is the explicit opt-out
    # (the site answers from its rows, and says so).
    min_cluster_size: int = Field(2, ge=1, description="the site's own privacy floor")
    cache_dir: str | None = None
    # CSV column selection: `columns` (comma-separated header names, in this order) and an
    # `id-column` that is dropped before anything else.
    columns: tuple[str, ...] | None = None
    id_column: str | None = None
    site_id: str | None = None
    # A table read through the agreed schema (docs/reference/schema.md): its file, and
    # the units of columns whose header does not say ("glucose=mmol/L,crea=umol/L").
    schema_path: str | None = None
    units: dict[str, str] | None = None
    # Site policy (fedcluster/common/site_policy.py): the most task rounds of one run the
    # site answers (describe excluded), and the algorithms it takes part in (None: all).
    max_rounds: int | None = Field(None, ge=1, description="task rounds answered per run")
    allow_algorithms: tuple[str, ...] | None = None
    # The fewest rows with which the site takes part at all (a smaller site's aggregates
    # are close to its rows); checked before every task, describe included.
    min_site_rows: int = Field(10, ge=1, description="the site's own minimum size")
    # The site's DP budget for its data across ALL runs ("epsilon" or "epsilon,delta";
    # client_app/privacy_budget.py): always finite, DEFAULT_DP_BUDGET when not set. And
    # whether the site answers only DP tasks.
    dp_budget: tuple[float, float] = Field(DEFAULT_DP_BUDGET)
    require_dp: bool = False
    # Whether a report (the final evaluation, Davies-Bouldin's pass, Table 1) may re-cut the
    # groups the model's clusters straddle into parts (a partition of the coordinator's
    # drawing, judged by the release step); false: every report from the groups whole.
    report_parts: bool = True
    # The disclosure ledger (client_app/release/ledger.py): a JSONL file, "off" for none.
    ledger_path: str | None = None
    # A named answered history (a study of its own; None: one per way of reading the data).
    history: str | None = None
    # Set by Flower's simulation engine.
    partition_id: int | None = None
    num_partitions: int | None = None

    @field_validator("site_id", "data_path", "label_column", "cache_dir", "id_column", "ledger_path",
                     "schema_path", "data_url", "data_query", "data_query_file", "data_table",
                     "data_password_file", "history", mode="before")
    @classmethod
    def _text(cls, value: Any) -> str | None:
        return None if value is None or value == "" else str(value)

    @field_validator("units", mode="before")
    @classmethod
    def _unit_list(cls, value: Any) -> dict[str, str] | None:
        if value is None or value == "":
            return None
        if isinstance(value, dict):
            return {str(k).strip(): str(v).strip() for k, v in value.items()}
        return parse_units(str(value).split(","), "item")

    @field_validator("columns", mode="before")
    @classmethod
    def _column_list(cls, value: Any) -> tuple[str, ...] | None:
        # Flower's node config holds scalars only, so the list is one comma-separated string.
        if value is None or value == "":
            return None
        names = [str(name).strip() for name in (value.split(",") if isinstance(value, str) else value)]
        if any(not name for name in names):
            raise ValueError(f"{value!r} has an empty column name; write names separated by commas")
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"{value!r} names {', '.join(duplicates)} more than once")
        return tuple(names)


    @field_validator("dp_budget", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> tuple[float, float]:
        if value is None or str(value).strip() == "":
            # An unset budget once meant "no limit": a coordinator's dp-rho then set the
            # noise on the site's rows. There is no such value any more.
            raise ValueError("is empty: there is no unlimited budget; leave the key out for "
                             f"the default {_budget_text(DEFAULT_DP_BUDGET)}, or write a "
                             "larger 'epsilon' or 'epsilon,delta'")
        parts = [p.strip() for p in str(value).split(",")] if not isinstance(value, (int, float)) \
            else [str(value)]
        try:
            epsilon = float(parts[0])
            delta = float(parts[1]) if len(parts) == 2 else 1e-5
        except ValueError:
            parts = []
        if len(parts) not in (1, 2) or not 0 < epsilon < math.inf or not 0 < delta < 1:
            raise ValueError(f"{value!r} is not 'epsilon' or 'epsilon,delta' with a finite "
                             "epsilon > 0 and 0 < delta < 1 (delta defaults to 1e-5)")
        return epsilon, delta

    @field_serializer("dp_budget")
    def _budget_as_text(self, value: tuple[float, float]) -> str:
        # As the key is written (and as a refusal names it): "10,1e-05".
        return _budget_text(value)

    @field_validator("max_rounds", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        # pydantic would read `true` as 1; a policy limit must be written as a number.
        if isinstance(value, bool):
            raise ValueError("must be a whole number of rounds >= 1, not a boolean")
        return value

    @field_validator("allow_algorithms", mode="before")
    @classmethod
    def _algorithm_list(cls, value: Any) -> tuple[str, ...] | None:
        if value is None:
            return None
        names = [str(n).strip() for n in (value.split(",") if isinstance(value, str) else value)]
        if not any(names):
            # An empty list would refuse every run; leaving the key out allows all.
            raise ValueError("is empty; name at least one algorithm, or leave the key out "
                             "to allow every algorithm")
        if any(not name for name in names):
            raise ValueError(f"{value!r} has an empty algorithm name; separate names by commas")
        unknown = [name for name in names if name not in ALGORITHMS]
        if unknown:
            raise ValueError(f"unknown algorithm(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(ALGORITHMS)}")
        return tuple(dict.fromkeys(names))



#: Keys of earlier versions that a site's groups made unnecessary: named, with why, so a
#: site operator learns that the policy changed rather than meeting "unknown key".
REMOVED_KEYS = {
    "differencing-guard": "the differencing guard is gone: a site answers every task from "
                          "its groups of at least min-cluster-size rows, so no combination "
                          "of replies isolates fewer (docs/explanation/privacy-model.md)",
    "guard-refuse": "the differencing guard is gone (see differencing-guard)",
    "allow-minmax": "a site's minima and maxima are now those of its groups' means, each a "
                    "mean of at least min-cluster-size rows like every other reply, so "
                    "there is nothing left to refuse (docs/explanation/privacy-model.md)",
}


def _budget_text(budget: tuple[float, float]) -> str:
    return f"{budget[0]:g},{budget[1]:g}"


def parse_node_config(values: dict[str, Any]) -> NodeConfig:
    """Validate a site's node config."""
    values = {_kebab(k): v for k, v in values.items()}
    removed = [f"node-config key '{key}' was removed: {REMOVED_KEYS[key]}; delete it"
               for key in values if key in REMOVED_KEYS]
    if removed:
        raise ConfigError("; ".join(removed))
    if values.get("data-url"):
        # Checked before the model, whose messages repeat a bad value: a URL may hold a
        # password, which no message may show.
        from fedcluster.client_app.data.sql_source import url_has_password
        from fedcluster.common.datasets import SiteDataError

        try:
            has_password = url_has_password(str(values["data-url"]))
        except SiteDataError as err:
            raise ConfigError(f"node-config key {err}") from None
        if has_password:
            raise ConfigError("node-config key 'data-url' holds a password (the URL is not "
                              "shown): give the password in 'data-password-file' or the "
                              "driver's environment (PGPASSWORD, PGPASSFILE) instead")
    try:
        return NodeConfig.model_validate(values)
    except ValidationError as err:
        raise ConfigError(_format(err, "node-config", NodeConfig)) from None


def reading_schema(node: NodeConfig):
    """The schema a site reads its table through (``schema-path``; None: without one),
    its keys checked together, for a file and a database alike: ``units`` needs a
    schema, and with one the plain keys ``columns``, ``id-column`` and ``label-column``
    do not apply (the schema says which columns are features, id and label).

    Raises
    ------
    SiteDataError
        Naming the keys that do not go together, or the schema file's problem.
    """
    from fedcluster.common.datasets import SiteDataError
    from fedcluster.common.schema import SchemaError, load_schema

    if node.schema_path is None:
        if node.units is not None:
            raise SiteDataError("node-config key 'units' applies to a table read through a "
                                "schema; set 'schema-path'")
        return None
    for key, value in (("columns", node.columns), ("id-column", node.id_column),
                       ("label-column", node.label_column)):
        if value is not None:
            raise SiteDataError(f"node-config key '{key}' does not apply with 'schema-path': "
                                "the schema says which columns are features, id and label")
    try:
        return load_schema(node.schema_path)
    except SchemaError as err:
        raise SiteDataError(f"schema-path: {err}") from None
