"""Validated configuration: the run config (a site's node config: ``client_app/node_config.py``).

Every value that crosses a trust boundary goes through one of these pydantic models.
Run-config keys are kebab-case (``n-clusters``), as Flower's ``--run-config`` writes them;
the Python API (:func:`fedcluster.simulate`) accepts the same keys with ``_``.
A bad key or value raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedcluster.common.algorithms import ALGORITHMS, CARDS

# The per-algorithm rules, derived from the algorithm cards (common/algorithms.py).
DEFAULT_INIT = {name: card.default_init for name, card in CARDS.items()}
ALLOWED_INIT = {name: card.allowed_init for name, card in CARDS.items()}
DEFAULT_WEIGHTED = {name: card.default_weighted for name, card in CARDS.items()}
DEFAULT_K_LOCAL_FACTOR = {name: card.k_local_factor for name, card in CARDS.items()}
# Why an algorithm cannot run under secure-aggregation (its server step is not a sum).
SECURE_REFUSED = {name: card.secure_refused for name, card in CARDS.items() if card.secure_refused}


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid."""


def parse_k_range(value: str) -> tuple[int, int] | None:
    """Parse ``k-range`` ``"LO:HI"`` into (LO, HI); ``""`` means no range (None).

    Every criterion needs at least 2 clusters and the elbow at least 3 values of k,
    hence 2 <= LO and LO + 2 <= HI.
    """
    if value == "":
        return None
    lo_text, sep, hi_text = str(value).partition(":")
    try:
        lo, hi = int(lo_text), int(hi_text)
    except ValueError:
        lo = hi = None
    if not sep or lo is None:
        raise ValueError(f"{value!r} is not of the form 'LO:HI' with integers, e.g. '2:15'")
    if lo < 2:
        raise ValueError(f"{value!r} starts below 2; the criteria need at least 2 clusters")
    if hi < lo + 2:
        raise ValueError(f"{value!r} needs HI >= LO + 2 (at least 3 values of k for the elbow)")
    return lo, hi


# Why an algorithm cannot run under DP: its site step is not one release of per-cluster
# sums and counts of bounded rows, so no sensitivity bounds what one row can change.
DP_REFUSED = {name: card.dp_refused for name, card in CARDS.items() if card.dp_refused}


def dp_problems(config: "RunConfig") -> list[str]:
    """Why this configuration cannot run under differential privacy (empty: it can).
    Only DWF and EWF with local-iters 1 send one release of per-cluster sums and counts
    per round, whose sensitivity the clipping box bounds."""
    if not config.dp_epsilon > 0:
        return []
    problems = []
    if config.algorithm in DP_REFUSED:
        problems.append(f"key 'dp-epsilon' > 0: algorithm '{config.algorithm}' cannot "
                        f"run under differential privacy: {DP_REFUSED[config.algorithm]}; "
                        "use 'dwf' or 'ewf' with local-iters 1")
    if config.local_iters != 1:
        problems.append(f"key 'local-iters' must be 1 under dp-epsilon (got "
                        f"{config.local_iters}): after several local iterations a site's "
                        "centroids are no longer sums with a bounded sensitivity")
    if config.init not in ("auto", "divisive", "random"):
        problems.append(f"key 'init' must be 'divisive', 'random' (or 'auto') under "
                        f"dp-epsilon, got '{config.init}': k-FED's local centroids are not "
                        "private")
    if config.scale != "none":
        problems.append("key 'scale' must be 'none' under dp-epsilon: its statistics "
                        "round is not private; scale with known constants at the sites")
    if config.k_range:
        problems.append("key 'k-range' cannot be used with dp-epsilon: choosing k "
                        "runs one federation per k, each spending the budget")
    if config.secure_aggregation:
        problems += _distributed_dp_problems(config)
    return problems


def _distributed_dp_problems(config: "RunConfig") -> list[str]:
    """Why dp-epsilon with secure-aggregation (distributed DP) cannot run: the sites
    must send linear noisy sums, which the server post-processes (docs/how-to/differential-privacy.md
    privacy")."""
    from fedcluster.common.privacy import box_within, parse_data_bounds

    problems = []
    if config.algorithm == "ewf":
        problems.append("keys 'dp-epsilon' and 'secure-aggregation' together need algorithm "
                        "'dwf': EWF averages every site's own centroids, a ratio a site would "
                        "form from its share of the noise before the sum (a nonlinear step "
                        "that voids the distributed guarantee)")
    box = parse_data_bounds(config.data_bounds)
    bound = config.secagg_data_bound  # 0: missing, which the secure-aggregation check names
    if box is not None and bound > 0 and not box_within(*box, bound):
        problems.append("key 'data-bounds' must lie within [-secagg-data-bound, "
                        "secagg-data-bound] under dp-epsilon with secure-aggregation (the "
                        "agreed scales of the secure sums come from that bound); raise "
                        "'secagg-data-bound'")
    return problems


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def kebab_keys(options: dict) -> dict:
    """Python keyword names (``n_clusters``) as config keys (``n-clusters``): the one
    conversion the Python API and the command line use."""
    return {_kebab(key): value for key, value in options.items()}


class _Strict(BaseModel):
    model_config = ConfigDict(
        alias_generator=_kebab, populate_by_name=True, extra="forbid", frozen=True
    )


class RunConfig(_Strict):
    """The run config (``[tool.flwr.app.config]`` in pyproject.toml, ``--run-config``).

    Defaults here equal those in pyproject.toml; docs/reference/run-config.md documents each key
    (tests/test_docs.py checks that the three agree).
    """

    algorithm: Literal[ALGORITHMS] = "dwf"
    n_clusters: int = Field(10, ge=1)
    num_rounds: int = Field(50, ge=1, description="maximum number of update rounds")
    fraction: float = Field(1.0, gt=0.0, le=1.0)
    min_sites: int = Field(2, ge=1)
    min_cluster_size: int = Field(2, ge=1, description="privacy floor p")
    seed: int = Field(0, ge=0)  # numpy seeds (SeedSequence) are non-negative
    tol: float = Field(1e-4, ge=0.0)
    score_tol: float = Field(0.0, ge=0.0, description="stop when the score stops improving")
    n_init: int = Field(1, ge=1)
    init: Literal["auto", "kfed", "divisive", "random", "kmeans++"] = "auto"
    weighted: Literal["auto"] | bool = "auto"
    k_local: int = Field(0, ge=0, description="k-FED local k; 0: n-clusters (kfed), 2 x n-clusters (init)")
    learning_rate: float = Field(1.0, gt=0.0, le=1.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    local_iters: int = Field(1, ge=1)
    # mini-batch k-means
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(0, ge=0, description="0 = the full local data")
    beta: float = Field(1.0, gt=0.0, le=1.0)
    # 0: only a cluster no site has a (reported) member of is dead; a small cluster with
    # members is a cluster (bench/quality.py: 0.01 re-seeded the real tiny clusters of
    # the tiny/outliers sets and held mini-batch at 1.11-1.17 x central, 0 at DWF's score)
    reassign_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    reassign_patience: int = Field(3, ge=1)
    # FKM
    prune: bool = True
    # FFCM
    fuzzifier: float = Field(2.0, gt=1.0)
    aggregation: Literal["avg1", "avg2"] = "avg1"
    # GTVMin k-means over a graph of sites
    topology: str = "complete"
    alpha: float = Field(1.0, ge=0.0, description="GTV penalty weight")
    consensus: Literal["best-site", "kmeans"] = "kmeans"
    consensus_rounds: int = Field(10, ge=0)
    round_timeout: float = Field(600.0, gt=0.0)
    # A study's clustering silently missing a site's data is the failure nobody sees: by
    # default a run that lost a site fails (its outputs written, for a person to look at);
    # a federation that expects sites to come and go says so (server_app/run_end.py).
    every_site: bool = Field(
        True, description="fail a run that lost a site (rejected, or not in its final "
        "evaluation), once its outputs are written; false: the run goes on without it")
    eval_every: int = Field(0, ge=0, description="an exact evaluation every N training rounds")
    # Federated preprocessing: one statistics round fixes a global per-feature transform.
    scale: Literal["none", "standard", "minmax"] = Field(
        "none", description="global feature scaling from one federated statistics round")
    # Real hospital tables (docs/reference/schema.md): the agreed schema's file, which
    # every site holds a copy of; its hash is checked in the describe round, and its
    # impute-* columns get a pooled imputation round before the statistics round.
    # (Named schema_file: pydantic's BaseModel has a ``schema`` method; the key is "schema".)
    schema_file: str = Field("", alias="schema",
                             description="the agreed schema file (TOML or JSON); '' = none")
    # A missing cell of a site's table read WITHOUT a schema (a schema sets its own):
    # an error (the site is dropped), its row dropped, or the pooled mean of its column.
    missing: Literal["error", "drop-row", "impute-mean"] = Field(
        "error", description="sites without a schema: a missing cell's policy")
    # Table 1 by cluster (strategies/profile.py): one round after the final evaluation
    # (and a ``bounds`` round before it for the numeric columns with no declared range).
    profile: bool = Field(
        True, description="profile the final clusters (Table 1 by cluster); not under "
        "dp-epsilon, not in a k-range run")
    # The final model's figures over the report's groups (client_app/data/report_table.py).
    report_groups: bool = Field(
        True, description="count the final figures where the model puts the rows: sites "
        "re-cut their straddling groups within its clusters, as their audits pass")
    # Choosing k: run the federation for every k in LO..HI ("" = one run with n-clusters).
    k_range: str = Field("", description="LO:HI, e.g. 2:15: run and evaluate every k in LO..HI")
    k_warm_start: bool = Field(
        True, description="k-range: start k+1 from k's centroids with the largest cluster split")
    # Differential privacy (docs/how-to/differential-privacy.md, common/privacy.py).
    dp_epsilon: float = Field(
        0.0, ge=0.0, description="the whole run's DP budget epsilon; 0 = no DP")
    dp_delta: float = Field(1e-5, gt=0.0, lt=1.0, description="the whole run's DP delta")
    data_bounds: str = Field(
        "", description="'LO:HI' (every feature) or 'LO:HI,LO:HI,...' (per feature): "
        "the sites clip their rows to this box; DP's sensitivity comes from it")
    # Simulation only: which built-in dataset the simulated sites partition.
    dataset: str = "digits"
    partitioning: str = "dirichlet:0.3"
    central_baseline: bool = True
    # Simulation: devices that come and go (server_app/availability.py). In a training
    # round each asked site is online with this chance (seeded per site and round) ...
    simulated_availability: float = Field(
        1.0, gt=0.0, le=1.0, description="simulation: the chance that a site asked in a "
        "training round is online (seeded per site and round); 1 = always")
    # ... and an online site's reply arrives after the round's deadline (dropped) with this.
    simulated_stragglers: float = Field(
        0.0, ge=0.0, lt=1.0, description="simulation: the chance that an online site's "
        "training reply arrives after the round's deadline and is dropped")
    output_dir: str = "outputs"
    run_name: str = ""
    resume_from: str = Field("", description="a checkpoint (file or run directory) to continue")
    # Secure aggregation (Flower's SecAgg+) of the sum-only rounds; see fedcluster/secure.py.
    secure_aggregation: bool = False
    secagg_data_bound: float = Field(
        0.0, ge=0.0, description="|every feature of every (scaled) row| <= this; required with secure-aggregation")
    secagg_quantization_range: int = Field(2**24, ge=2, lt=2**31)
    secagg_num_shares: float = Field(1.0, gt=0.0, le=1.0, description="fraction of the round's sites")
    secagg_reconstruction_threshold: float = Field(0.67, gt=0.0, le=1.0,
                                                   description="fraction of the shares")

    @field_validator("partitioning", "topology", "k_range", "data_bounds")
    @classmethod
    def _spec_parses(cls, value: str, info) -> str:
        # Each of these keys is a small language with its parser in the module that uses
        # it (imported here, when needed, to keep the config light); the parser's error
        # says what is wrong.
        from fedcluster.common.datasets import parse_partitioning
        from fedcluster.common.privacy import parse_data_bounds
        from fedcluster.common.topology_spec import parse_topology

        parsers = {"partitioning": parse_partitioning, "topology": parse_topology,
                   "k_range": parse_k_range, "data_bounds": parse_data_bounds}
        parsers[info.field_name](value)
        return value

    @model_validator(mode="after")
    def _one_missing_policy(self) -> "RunConfig":
        if self.schema_file and self.missing != "error":
            raise ValueError("key 'missing' is for sites without a schema; with 'schema' the "
                             "schema's own policies apply (its top-level or a column's "
                             "'missing')")
        return self

    @model_validator(mode="after")
    def _bounds_fit_scale(self) -> "RunConfig":
        if self.data_bounds and self.scale != "none":
            raise ValueError("key 'data-bounds' cannot be combined with 'scale': the box is in "
                             "the data's own units, the sites would cluster scaled rows")
        return self

    @model_validator(mode="after")
    def _private_run_possible(self) -> "RunConfig":
        for problem in dp_problems(self):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _init_fits_algorithm(self) -> "RunConfig":
        if self.init != "auto" and self.init not in ALLOWED_INIT[self.algorithm]:
            raise ValueError(
                f"init '{self.init}' does not apply to algorithm '{self.algorithm}'; "
                f"use one of {', '.join(ALLOWED_INIT[self.algorithm])}"
            )
        return self

    @model_validator(mode="after")
    def _secure_aggregation_applies(self) -> "RunConfig":
        if not self.secure_aggregation:
            return self
        why = SECURE_REFUSED.get(self.algorithm)
        if self.algorithm == "ffcm" and self.aggregation == "avg2":
            why = ("FFCM's avg2 runs k-means on the set of every site's centres, which a sum "
                   "cannot give; use aggregation = \"avg1\"")
        if why is not None:
            raise ValueError(f"secure-aggregation = true does not apply to algorithm "
                             f"'{self.algorithm}': {why}")
        if self.init == "kfed":
            raise ValueError("secure-aggregation = true needs a sum-only initialisation: init "
                             "'kfed' sends each site's local centroids; use init = \"divisive\" "
                             "(the default under secure aggregation)")
        if self.k_range:
            raise ValueError("secure-aggregation = true is not supported with k-range")
        if self.secagg_data_bound <= 0:
            raise ValueError("secure-aggregation = true needs 'secagg-data-bound' > 0, a bound B "
                             "with |x| <= B for every feature of every row the sites cluster "
                             "(after scale): the agreed scale of the secure sums")
        if self.min_sites < 2:
            raise ValueError("secure-aggregation = true needs 'min-sites' >= 2 (a sum over one "
                             "site is that site's reply)")
        return self

    @model_validator(mode="after")
    def _devices_simulated_in_plain_rounds(self) -> "RunConfig":
        if self.secure_aggregation and (self.simulated_availability < 1
                                        or self.simulated_stragglers > 0):
            raise ValueError("'simulated-availability' and 'simulated-stragglers' apply to "
                             "plain training rounds; under secure-aggregation a site that "
                             "drops out is SecAgg+'s to handle, which they do not simulate")
        return self

    @property
    def simulates_devices(self) -> bool:
        """Whether training rounds lose sites to simulated absence (``simulated-*``)."""
        return self.simulated_availability < 1 or self.simulated_stragglers > 0

    @property
    def private(self) -> bool:
        """Whether the run is differentially private (``dp-epsilon`` > 0)."""
        return self.dp_epsilon > 0

    @property
    def resolved_init(self) -> str:
        """The initialisation actually used (``auto`` resolved per algorithm; under
        secure aggregation and DP ``divisive``, the start that only sends sums and counts:
        ``strategies/divisive.py``)."""
        if self.init == "auto" and (self.secure_aggregation or self.private):
            return "divisive"
        return DEFAULT_INIT[self.algorithm] if self.init == "auto" else self.init

    @property
    def resolved_weighted(self) -> bool:
        """Whether the server k-means on centroids weights them by their counts."""
        if self.weighted == "auto":
            return DEFAULT_WEIGHTED.get(self.algorithm, False)
        return bool(self.weighted)

    @property
    def resolved_k_local(self) -> int:
        """Local clusters per site in a k-FED round (``0`` resolved per algorithm)."""
        return self.k_local or DEFAULT_K_LOCAL_FACTOR.get(self.algorithm, 1) * self.n_clusters

    @property
    def k_bounds(self) -> tuple[int, int] | None:
        """``k-range`` as (lo, hi), both included; None when no range is set."""
        return parse_k_range(self.k_range)

    @property
    def seeds(self) -> list[int]:
        """One seed per n-init repetition."""
        return [self.seed + i for i in range(self.n_init)]


#: Words people write for the ones the config keys use ('data-file' is 'data-path').
_SAME_WORD = {"file": "path", "filename": "path", "filepath": "path", "folder": "dir",
              "directory": "dir", "cache": "cache-dir", "schema": "schema-path",
              "data": "data-path", "ledger": "ledger-path", "id": "id-column",
              "label": "label-column", "url": "data-url", "query": "data-query"}


def _closest(key: str, known: list[str]) -> list[str]:
    """The known key an unknown one most likely meant: the same words with the configs'
    own for people's (:data:`_SAME_WORD`), else the closest spelling."""
    words = key.lower().replace("_", "-").split("-")
    for reworded in ("-".join(_SAME_WORD.get(w, w) for w in words),
                     "-".join(words[:-1] + [_SAME_WORD.get(words[-1], words[-1])]),
                     _SAME_WORD.get(key.lower(), "")):
        if reworded in known and reworded != key:
            return [reworded]
    return difflib.get_close_matches(key, known, n=1)


def _format(err: ValidationError, what: str, model: type | None = None) -> str:
    """The errors of a validation, each naming its key (an unknown key with the known one
    it is closest to, when ``model`` says which there are)."""
    known = [] if model is None else [field.alias or _kebab(name)
                                      for name, field in model.model_fields.items()]
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if not key:  # a check across keys (model validator)
            lines.append(f"{what}: {e['msg'].removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            close = _closest(key, known)
            lines.append(f"unknown {what} key '{key}'"
                         + (f" (did you mean '{close[0]}'?)" if close else ""))
        else:
            lines.append(f"{what} key '{key}': {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def parse_run_config(values: dict[str, Any]) -> RunConfig:
    """Validate a run config given with kebab-case (or snake_case) keys."""
    try:
        return RunConfig.model_validate({_kebab(k): v for k, v in values.items()})
    except ValidationError as err:
        raise ConfigError(_format(err, "run-config", RunConfig)) from None


def run_config_defaults() -> dict[str, Any]:
    """The defaults as a kebab-case dict (what pyproject.toml declares)."""
    return RunConfig().model_dump(by_alias=True)
