"""A site's differential-privacy budget across runs (node config ``dp-budget``).

A run's ``dp-epsilon`` bounds what THAT run discloses, and the coordinator chooses it; a
hospital answering run after run on the same table needs a bound on all of them
together that no coordinator chooses. ``dp-budget = "epsilon,delta"`` (delta defaults to
1e-5) is that bound for the site's data, spent across ALL runs. It is always on: a site
that sets none has ``node_config.DEFAULT_DP_BUDGET`` (epsilon 10 at delta 1e-5, rho-zCDP
about 1.55; why that value: docs/reference/node-config.md), and there is no unlimited
value. So no ``dp-rho`` a coordinator sends can lower the noise on a site's rows below
what its remaining budget allows.

- The spend is kept as rho-zCDP, which adds up over releases (Bun & Steinke 2016,
  Lemma 2.3): every noised task (``private_tasks.SPENDING_TASKS``) adds what the SITE'S
  OWN noise costs, ``privacy.own_noise_rho(dp-rho, dp-noise-share)`` (``dp-rho`` under
  local DP; ``dp-rho`` / share^2 under distributed DP, where the server's share would
  otherwise set the site's noise), to its run's entry BEFORE its reply leaves the site;
  a task that would take the total past the budget's rho
  (``privacy.rho_from_epsilon(epsilon, delta)``) is refused, naming ``dp-budget`` and
  what is left.
- A DP run's ``describe`` handshake and every DP task carry the run's planned total
  (``dp-rho-planned``, the run's whole ``dp-epsilon``/``dp-delta`` as rho; scaled by the
  task's share the same way): a run that would not fit in what is left is refused at
  its first task (the server then rejects the site at once), with the spent and
  remaining budget in the message, so it does not spend half of what is left on rounds
  it cannot finish.
- The ledger is a JSON file beside the data cache (``<cache-dir>/privacy-budget/
  budget-<key>.json``), written under a lock and replaced atomically, so it survives
  SuperNode restarts and is shared by the runs of every SuperNode using that cache. In
  simulation (no data file) it lives in the run's ``Context.state``: one budget per run.
  The key is ``SiteClient._budget_key``: the site's data lineage, which follows its data
  across versions (rows appended, deleted, corrected; a file exported anew under another
  name that shares rows with the last). A ledger kept by an earlier release under the
  rows' fingerprint is carried into the first lineage ledger made beside it
  (:func:`ledger_in_file`): what was spent stays spent.

Epsilons are reported at the budget's delta: "remaining" is the largest epsilon (at
that delta) a further run may still have, epsilon_from_rho(budget rho - spent rho).
What this does not stop: a copy of the data under another cache directory, or read
another way (another schema, other columns), starts a fresh budget; a site that does not
set ``require-dp`` still answers non-DP runs (from its groups), which the budget does not
count.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from dataclasses import dataclass

from flwr.app import ConfigRecord, RecordDict

from fedcluster.client_app import site_files
from fedcluster.client_app.site_policy import PolicyRefusal
from fedcluster.common import privacy

#: The task parameter carrying the run's whole planned spend (rho-zCDP).
RHO_PLANNED = "dp-rho-planned"
#: The ``Context.state`` record of a simulated site's ledger.
STATE_RECORD = "fedcluster-privacy-budget"
#: Relative slack for the floating-point sum of a run's equal per-round shares.
_SLACK = 1e-9


class BudgetExhausted(PolicyRefusal):
    """The site's ``dp-budget`` has no room for this run or task."""


@dataclass(frozen=True)
class Budget:
    """A site's total (epsilon, delta) for one data set."""

    epsilon: float
    delta: float

    @property
    def rho(self) -> float:
        return privacy.rho_from_epsilon(self.epsilon, self.delta)

    def epsilon_of(self, rho: float) -> float:
        """``rho`` as epsilon at the budget's delta."""
        return privacy.epsilon_from_rho(max(rho, 0.0), self.delta)


def spent_rho(ledger: dict) -> float:
    """The rho spent by every run in ``ledger``."""
    return sum(float(run["spent-rho"]) for run in ledger.get("runs", {}).values())


def status(budget: Budget, ledger: dict) -> dict:
    """The budget's state as a data officer reads it (epsilons at the budget's delta)."""
    spent = spent_rho(ledger)
    return {"budget-epsilon": budget.epsilon, "budget-delta": budget.delta,
            "spent-epsilon": budget.epsilon_of(spent),
            "remaining-epsilon": budget.epsilon_of(budget.rho - spent),
            "runs": len(ledger.get("runs", {}))}


def check_fits(budget: Budget, ledger: dict, run_id: int, planned: float,
               noise_share: float = 1.0) -> None:
    """Refuse a run whose planned spend does not fit in what is left (a run already in
    the ledger was admitted before and passes; its tasks are still checked one by one).
    ``planned`` is the run's rho; the site's own cost of it is
    ``privacy.own_noise_rho(planned, noise_share)``.

    Raises
    ------
    BudgetExhausted
        With the spent and remaining budget.
    """
    if str(run_id) in ledger.get("runs", {}):
        return
    own = privacy.own_noise_rho(planned, noise_share)
    if not spent_rho(ledger) + own <= budget.rho * (1.0 + _SLACK):
        raise BudgetExhausted(_refusal(budget, ledger, f"this run plans epsilon "
                                       f"{budget.epsilon_of(own):.4g}", _share(noise_share)))


def charge(budget: Budget, ledger: dict, run_id: int, rho: float, planned: float | None,
           noise_share: float = 1.0) -> float:
    """Add what one task's noise costs the site to run ``run_id`` in ``ledger`` (in
    place), or refuse it; return the rho charged.

    Parameters
    ----------
    rho
        The task's ``dp-rho`` (the zCDP of the whole noise it asks for).
    planned
        The run's whole planned spend, checked at the run's first charged task (None:
        the server sent none; each task is still checked).
    noise_share
        The share of that noise the site adds (``dp-noise-share``; 1 under local DP):
        the site charges ``privacy.own_noise_rho(rho, noise_share)``, the zCDP of its
        own noise alone, and the planned spend scaled the same way.

    Raises
    ------
    BudgetExhausted
        The run (at its first task) or this task does not fit in what is left; the
        message gives the spent and remaining budget.
    """
    runs = ledger.setdefault("runs", {})
    key = str(run_id)
    if planned is not None:
        check_fits(budget, ledger, run_id, planned, noise_share)
    own = privacy.own_noise_rho(rho, noise_share)
    if not spent_rho(ledger) + own <= budget.rho * (1.0 + _SLACK):  # (an inf or NaN too)
        raise BudgetExhausted(_refusal(budget, ledger, f"this task would spend epsilon "
                                       f"{budget.epsilon_of(own):.4g} more",
                                       _share(noise_share)))
    run = runs.setdefault(key, {"planned-rho": None if planned is None else
                                privacy.own_noise_rho(planned, noise_share),
                                "spent-rho": 0.0, "tasks": 0})
    run["spent-rho"] = float(run["spent-rho"]) + own
    run["tasks"] = int(run["tasks"]) + 1
    return own


def _share(noise_share: float) -> str:
    """How a distributed-DP task's cost came about, for a refusal (nothing under local DP)."""
    if noise_share == 1.0:
        return ""
    return (f" for its own share {noise_share:.4g} of the noise alone (dp-rho / share^2: "
            f"the rest comes from sites it cannot check)")


def _refusal(budget: Budget, ledger: dict, why: str, how: str = "") -> str:
    now = status(budget, ledger)
    return (f"site policy dp-budget={budget.epsilon:g},{budget.delta:g}: {why} (at delta "
            f"{budget.delta:g}){how}, but this data set's budget has epsilon "
            f"{now['spent-epsilon']:.4g} spent over {now['runs']} run(s) and "
            f"{now['remaining-epsilon']:.4g} remaining; the site answers none of this run's "
            f"DP tasks")


@contextlib.contextmanager
def ledger_in_file(directory: str | os.PathLike, key: str):
    """The budget ledger of a data set in ``directory`` (a deployed site's cache), by its
    budget ``key``, held under its lock; what the block changes is written back
    atomically.

    Raises
    ------
    OSError
        The directory cannot hold the file.
    ValueError
        The file is not a ledger (it is never overwritten then).
    """
    with site_files.locked(directory, f"budget-{key[:40]}.json") as target:
        ledger = {"data": key, "runs": {}}
        if not target.exists() and key.startswith("lineage-"):
            ledger["runs"].update(_carried(Path(directory)))
        if target.exists():
            try:
                ledger = json.loads(target.read_text(encoding="utf-8"))
                ledger["runs"]  # noqa: B018 - the one key every ledger has
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{target} is not a privacy-budget ledger; move it away only "
                                 f"if you accept losing the record of what was spent") from None
        before = json.dumps(ledger, sort_keys=True)
        yield ledger
        if json.dumps(ledger, sort_keys=True) != before:
            text = json.dumps(ledger, indent=1, sort_keys=True).encode()
            site_files.replace_atomically(target, lambda out: out.write(text))


def _carried(directory: Path) -> dict:
    """What the ledgers an earlier release kept in ``directory`` (keyed by the rows'
    fingerprint, not by a lineage) spent, as one entry: carried into a site's first
    lineage ledger so that nothing spent is forgotten (all of them: which data each was
    for is not known here, so the count can only be larger than the truth)."""
    spent, tasks, names = 0.0, 0, []
    for path in sorted(directory.glob("budget-*.json")):
        try:
            earlier = json.loads(path.read_text(encoding="utf-8"))
            if str(earlier.get("data", "")).startswith("lineage-"):
                continue
            spent += spent_rho(earlier)
            tasks += sum(int(run.get("tasks", 0)) for run in earlier["runs"].values())
            names.append(path.name)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    if not names:
        return {}
    return {"carried": {"planned-rho": None, "spent-rho": spent, "tasks": tasks,
                        "carried-from": names}}


@contextlib.contextmanager
def ledger_in_state(state: RecordDict, key: str):
    """The budget ledger of ``key`` in ``Context.state`` (simulation: one run)."""
    record = state.config_records.get(STATE_RECORD)
    ledger = {"data": key, "runs": {}}
    if record is not None and record.get("data") == key:
        ledger = json.loads(str(record["ledger"]))
    yield ledger
    state.config_records[STATE_RECORD] = ConfigRecord(
        {"data": key, "ledger": json.dumps(ledger)})
