"""A site's differential-privacy budget across runs (node config ``dp-budget``).

A run's ``dp-epsilon`` bounds what THAT run discloses; a hospital answering run after run
on the same table needs a bound on all of them together. ``dp-budget = "epsilon,delta"``
(delta defaults to 1e-5) is that bound for the site's data (its rows, by
:func:`~fedcluster.client_app.site_data.data_fingerprint`), spent across ALL runs:

- The spend is kept as rho-zCDP, which adds up over releases (Bun & Steinke 2016,
  Lemma 2.3): every noised task (``private_tasks.SPENDING_TASKS``) adds the task's
  ``dp-rho`` to its run's entry BEFORE its reply leaves the site; a task that would take
  the total past the budget's rho (``privacy.rho_from_epsilon(epsilon, delta)``) is refused.
- A DP run's ``describe`` handshake and every DP task carry the run's planned total
  (``dp-rho-planned``, the run's whole ``dp-epsilon``/``dp-delta`` as rho): a run that
  would not fit in what is left is refused at its first task (the server then rejects
  the site at once), with the spent and remaining budget in the message, so it does not
  spend half of what is left on rounds it cannot finish.
- The ledger is a JSON file beside the data cache (``<cache-dir>/privacy-budget/
  budget-<fingerprint>.json``), written under a lock and replaced atomically, so it
  survives SuperNode restarts and is shared by the runs of every SuperNode using that
  cache. In simulation (no data file) it lives in the run's ``Context.state``.

Epsilons are reported at the budget's delta: "remaining" is the largest epsilon (at
that delta) a further run may still have, epsilon_from_rho(budget rho - spent rho).
What this does not stop: a copy of the data under another cache directory, or the same
patients in a changed file (another fingerprint), starts a fresh budget; a site that
does not set ``require-dp`` still answers non-DP runs, which the budget does not count.
"""

from __future__ import annotations

import contextlib
import json
import os
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


def check_fits(budget: Budget, ledger: dict, run_id: int, planned: float) -> None:
    """Refuse a run whose planned spend does not fit in what is left (a run already in
    the ledger was admitted before and passes; its tasks are still checked one by one).

    Raises
    ------
    BudgetExhausted
        With the spent and remaining budget.
    """
    if str(run_id) in ledger.get("runs", {}):
        return
    if spent_rho(ledger) + planned > budget.rho * (1.0 + _SLACK):
        raise BudgetExhausted(_refusal(budget, ledger, f"this run plans epsilon "
                                       f"{budget.epsilon_of(planned):.4g}"))


def charge(budget: Budget, ledger: dict, run_id: int, rho: float, planned: float | None) -> None:
    """Add one task's ``rho`` to run ``run_id`` in ``ledger`` (in place), or refuse it.

    Parameters
    ----------
    planned
        The run's whole planned spend, checked at the run's first charged task (None:
        the server sent none; each task is still checked).

    Raises
    ------
    BudgetExhausted
        The run (at its first task) or this task does not fit in what is left; the
        message gives the spent and remaining budget.
    """
    runs = ledger.setdefault("runs", {})
    key = str(run_id)
    if planned is not None:
        check_fits(budget, ledger, run_id, planned)
    if spent_rho(ledger) + rho > budget.rho * (1.0 + _SLACK):
        raise BudgetExhausted(_refusal(budget, ledger, f"this task would spend epsilon "
                                       f"{budget.epsilon_of(rho):.4g} more"))
    run = runs.setdefault(key, {"planned-rho": planned, "spent-rho": 0.0, "tasks": 0})
    run["spent-rho"] = float(run["spent-rho"]) + rho
    run["tasks"] = int(run["tasks"]) + 1


def _refusal(budget: Budget, ledger: dict, why: str) -> str:
    now = status(budget, ledger)
    return (f"site policy dp-budget={budget.epsilon:g},{budget.delta:g}: {why} (at delta "
            f"{budget.delta:g}), but this data set's budget has epsilon "
            f"{now['spent-epsilon']:.4g} spent over {now['runs']} run(s) and "
            f"{now['remaining-epsilon']:.4g} remaining; the site answers none of this run's "
            f"DP tasks")


@contextlib.contextmanager
def ledger_in_file(directory: str | os.PathLike, fingerprint: str):
    """The budget ledger of a data set in ``directory`` (a deployed site's cache), held
    under its lock; what the block changes is written back atomically.

    Raises
    ------
    OSError
        The directory cannot hold the file.
    ValueError
        The file is not a ledger (it is never overwritten then).
    """
    with site_files.locked(directory, f"budget-{fingerprint[:40]}.json") as target:
        ledger = {"data": fingerprint, "runs": {}}
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


@contextlib.contextmanager
def ledger_in_state(state: RecordDict, fingerprint: str):
    """The budget ledger in ``Context.state`` (simulation: one series of runs)."""
    record = state.config_records.get(STATE_RECORD)
    ledger = {"data": fingerprint, "runs": {}}
    if record is not None and record.get("data") == fingerprint:
        ledger = json.loads(str(record["ledger"]))
    yield ledger
    state.config_records[STATE_RECORD] = ConfigRecord(
        {"data": fingerprint, "ledger": json.dumps(ledger)})
