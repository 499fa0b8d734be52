"""Site policy: limits a site sets in its own node config and enforces itself.

``allow-algorithms``
    The algorithms (run-config ``algorithm``) the site takes part in; a run of any other
    is refused at every task, the ``describe`` handshake included, so the server rejects
    the site at once (``rejected-sites``).
``max-rounds``
    The most task rounds of ONE run the site answers. Every task but ``describe``
    counts (statistics, initialisation, training and evaluation rounds alike: each
    discloses aggregates of the rows; ``describe`` discloses only the number of rows
    and the width, and counting it would let a site be admitted that then answers
    nothing). Only answered tasks count; once N are answered, every later task of the
    run is refused. The site declares N in its describe reply (a policy, not data), so
    the server counts the rounds too and stops asking it (``sites-at-max-rounds`` in
    the model); a task that still reaches the site (a reply the server never got)
    is refused and recorded under ``site-failures``. A new run (a resumed run
    included) starts a new count.

``min-site-rows``
    The fewest rows with which the site takes part (default 10): a smaller site refuses
    every task, ``describe`` included, so the server rejects it at once.

``require-dp``
    The site answers only differentially private tasks (those carrying ``dp-rho``; the
    size-and-width ``describe`` handshake is answered too): every other task of a run
    is refused, naming the run settings that make it private.
``dp-budget``
    The site's DP budget across all runs on its data (``client_app/privacy_budget.py``):
    always on (epsilon 10 at delta 1e-5 when not set), every DP task charged before its
    reply leaves.

The ``min-cluster-size`` floor is another site policy: the size of the groups the site
answers from (``client_app/data/group_table.py``) and the fewest rows of a cluster it
reports (``client_app/tasks.py``).

The count must survive between messages: in a deployment Flower starts a fresh ClientApp
process per message, but the SuperNode keeps one ``Context.state`` per run (series) and
hands it to each process, storing back what the process changed (flwr 1.39:
``supernode/servicer/runtime/runtime_handlers.py``, ``push_task_output``). The count is
kept there, tagged with the run id, so a state shared by several runs of one series
still counts each run on its own.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, RecordDict

from fedcluster.client_app.node_config import NodeConfig

#: The ``Context.state`` config record that holds the round count.
STATE_RECORD = "fedcluster-site-policy"


class PolicyRefusal(Exception):
    """The site's own policy refuses this task; the message names the policy."""


def check_algorithm(node: NodeConfig, algorithm: str) -> None:
    """Refuse a run of an algorithm the site does not allow.

    Raises
    ------
    PolicyRefusal
        Naming the algorithm and the allowed list.
    """
    allowed = node.allow_algorithms
    if allowed is not None and algorithm not in allowed:
        listed = ",".join(allowed)
        raise PolicyRefusal(
            f"site policy allow-algorithms={listed} refuses algorithm {algorithm!r} "
            f"(this site takes part only in: {', '.join(allowed)})"
        )


def check_site_rows(node: NodeConfig, n_rows: int, waiting: int = 0, held_back: int = 0,
                    held_back_why: str = "") -> None:
    """Refuse every task of a site with fewer than ``min-site-rows`` rows in groups
    (``waiting``: its rows in no group yet, ``held_back`` of them by the versions audit
    for ``held_back_why``).

    Raises
    ------
    PolicyRefusal
        Naming the policy, the site's size and the minimum; or, where the versions audit
        held back every row, the audit's finding.
    """
    if n_rows == 0 and held_back:
        raise PolicyRefusal(
            f"the versions audit held back {held_back} of this site's {waiting} usable row(s) "
            f"({held_back_why}), so it answers nothing: these rows were answered from before "
            "in other groups (another file of the same columns, or a lower min-cluster-size), "
            "and no grouping of them found was safe to answer from besides; a later version "
            "with new rows tries again (docs/explanation/privacy-model.md, Versions)")
    if n_rows + waiting >= node.min_site_rows and n_rows == 0:
        raise PolicyRefusal(
            f"site policy min-cluster-size={node.min_cluster_size}: this site holds {waiting} "
            f"row(s), fewer than {node.min_cluster_size}: they make no group, so it answers "
            "nothing")
    if n_rows + waiting < node.min_site_rows:
        n_rows += waiting  # (its size, whether its rows are in groups yet or not)
    if n_rows < node.min_site_rows:
        raise PolicyRefusal(
            f"site policy min-site-rows={node.min_site_rows}: this site holds {n_rows} rows "
            f"and takes part only with at least {node.min_site_rows}"
        )


def rounds_answered(state: RecordDict, run_id: int) -> int:
    """How many counted task rounds of run ``run_id`` this site has answered."""
    record = state.config_records.get(STATE_RECORD)
    if record is None or record.get("run-id") != str(run_id):
        return 0  # a new run starts a new count
    return int(record.get("answered", 0))


def check_rounds(node: NodeConfig, state: RecordDict, run_id: int, task: str) -> None:
    """Refuse a counted task once ``max-rounds`` tasks of this run were answered.

    Raises
    ------
    PolicyRefusal
        Naming the policy and its limit.
    """
    if node.max_rounds is None or task == "describe":
        return
    answered = rounds_answered(state, run_id)
    if answered >= node.max_rounds:
        raise PolicyRefusal(
            f"site policy max-rounds={node.max_rounds} reached: this site answered "
            f"{answered} task rounds of run {run_id} and answers no more"
        )


def count_round(state: RecordDict, run_id: int, task: str) -> None:
    """Record one answered task of run ``run_id`` (``describe`` is not counted)."""
    if task == "describe":
        return
    state.config_records[STATE_RECORD] = ConfigRecord(
        # The run id as text: Flower's run ids are unsigned 64-bit, a record's ints signed.
        {"run-id": str(run_id), "answered": rounds_answered(state, run_id) + 1}
    )


def check_private(node: NodeConfig, task: str, params: dict) -> None:
    """Refuse a task that is not differentially private at a ``require-dp`` site.

    Raises
    ------
    PolicyRefusal
        Naming the policy, the task and the run settings that make it private.
    """
    if node.require_dp and task != "describe" and "dp-rho" not in params:
        raise PolicyRefusal(
            f"site policy require-dp refuses task {task!r}: it is not differentially private; "
            f"this site answers only runs with dp-epsilon > 0 and data-bounds given (and scale "
            f"'none': the scaling statistics round is not private)")


#: The ``Context.state`` record counting a simulated site's DP noise draws per run.
DRAWS_RECORD = "fedcluster-noise-draws"


def next_draw(state: RecordDict, run_id: int) -> int:
    """The number of this DP noise draw of run ``run_id`` at this site (0, 1, ...): part
    of a simulated site's noise seed, so that no two tasks of a run share a draw."""
    record = state.config_records.get(DRAWS_RECORD)
    draws = int(record["draws"]) if record is not None and record.get("run-id") == str(run_id) else 0
    state.config_records[DRAWS_RECORD] = ConfigRecord({"run-id": str(run_id), "draws": draws + 1})
    return draws
