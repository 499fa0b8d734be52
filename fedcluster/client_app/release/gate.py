"""The release step: every value a site sends leaves here, plain, secure or under DP.

A task computes its reply from what it was given (the site's groups, never rows; under
DP the site's clipped rows) and says which of its figures rest on which rows (its
``rules``: ``floor.py``). The gate then:

0. :func:`in_record` and :func:`admit_report` - before the task runs, the table it
   answers from must be in the site's RECORD (``record/``: every group of rows the site
   ever released values from, of every run, reading, process and report): a version's
   table is recorded where it is made, after the one audit (``audit/``) judged it; a
   report's parts are judged here, with the whole record, and recorded, under the
   record's one lock (:meth:`record.Record.held`, which the ClientApp holds from reading
   the record through the task to writing the reply's ledger line). A table the record
   does not hold answers nothing;
1. :func:`admit` - before the task runs: a reply over all the site's rows is refused by
   a site with fewer rows than the floor (``floor.WHOLE_SITE``);
2. :func:`screen` - after it: the floor's rules applied (a cluster under p withheld, a
   small cell read 0, a count under p read ``"<p"``), and the reply's BASIS attached:
   which table of the site's groups it is a function of (its digest and place in the
   site's answered history), at which p_site, through which of the table's statistics
   (its groups' counts, sums, spread units' m2), or, under DP, the site's rows;
3. :func:`leave` - the reply in Flower's form (under SecAgg+: only its encoded terms),
   its line written to the site's disclosure ledger first (``ledger.py``: every value,
   the basis; a ledger that cannot be written stops the reply: nothing leaves unrecorded).

What a table's own statistics may be is settled by the rules of this package that need
its values, applied in the data layer where the table is made: the lone-cell rule
(``lone_cells.py``), spread units and the dominance rule (``spreads.py``,
``dominance.py``, the p% rule on means); what the record may take is the one audit's
(``audit/``). docs/explanation/privacy-model.md says what each rule does and does not
stop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from fedcluster.client_app.release import audit
from fedcluster.client_app.release import floor as floor_rules
from fedcluster.client_app.release import record
from fedcluster.client_app.site_groups import SiteGroups
from fedcluster.client_app.task_io import TaskReply
from fedcluster.common import protocol
from fedcluster.common import secure_codec as secure

__all__ = ["STATISTICS", "Admission", "admit", "admit_report", "basis", "in_record", "leave",
           "partition_digest", "screen", "values_of"]

#: Which of a group table's statistics each task's reply is a function of: ``counts``
#: (rows per group), ``sums`` (per feature, over present cells), ``spreads`` (the spread
#: units' m2: an SSE, a scatter, a variance, a squared deviation).
STATISTICS = {
    "describe": ("counts",),
    "impute_stats": ("counts", "sums"),
    "stats": ("counts", "sums", "spreads"),
    "bounds": ("counts", "sums"),
    "value_range": ("counts", "sums"),
    "kmeanspp": ("counts", "sums"),
    "evaluate_distances": ("counts", "sums"),
}
_ALL = ("counts", "sums", "spreads")


def values_of(reply_arrays, evaluation=None) -> dict:
    """A reply's named arrays (a protocol NamedTuple, or None) as JSON-ready lists, and
    those of the evaluation it carries (``evaluate-too``) under ``evaluation-`` names:
    what the ledger records of a plain reply."""
    if reply_arrays is None:
        return {}
    values = {}
    for prefix, arrays in (("", reply_arrays), (protocol.EVALUATION_PREFIX, evaluation)):
        if arrays is not None:
            values.update({prefix + name: np.asarray(value).tolist()
                           for name, value in arrays._asdict().items() if value is not None})
    return values


def partition_digest(parts: list[np.ndarray], p: int) -> str:
    """The key of a report partition: its parts' instances, sorted, and p."""
    text = json.dumps([p, [np.sort(part).tolist() for part in parts]])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Admission:
    """The release step's judgement of a report's parts.

    Attributes
    ----------
    admitted : bool
        The record holds them (now, or from an earlier task): their values may leave.
    why : str
        Where not: the audit's first finding.
    instances : (n,) int64
        The instances its findings rest on (a coarser answer leaves them out).
    digest : str
        The partition's key (``TableRef.partition`` of the table it makes).
    """

    admitted: bool
    why: str = ""
    digest: str = ""
    instances: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))


def in_record(groups: SiteGroups) -> bool:
    """Whether the table ``groups`` answers from is in the site's record (a table of rows,
    p_site 1, has no record: it opted out of the promise)."""
    ref = groups.table_ref
    if groups.min_size <= 1:
        return True
    if ref is None:
        return False
    if str(ref.store).startswith(record.MEMORY_PREFIX):
        return True  # (made with its record, in this process; a report's parts admitted)
    meta = record.Store.read_meta(ref.store)
    if int(ref.number) >= len(meta.get("tables", [])):
        return False
    if ref.partition is None:
        return True
    store = record.Store(None, {**meta, "instances": 0, "groups": 0, "members": 0})
    return any(known["digest"] == ref.partition for known in store.reports_of(ref.number))


def admit_report(store, table: int, parts: list[np.ndarray], carried, p: int, width: int,
                 whole=(), snapped=()) -> Admission:
    """Judge a report's ``parts`` (the record's instances) of table ``table`` with the
    whole record ``store`` (held under its lock by the caller) and record them if they
    pass (``carried``: (d,) the features they carry at a stood-in mean; ``whole``, the
    table's groups kept whole in them, and ``snapped``, the rows that went with an earlier
    part: how to make the same table again). A partition the record holds already is admitted
    as it is (the same table asked again)."""
    digest = partition_digest(parts, p)
    if any(known["digest"] == digest for known in store.reports_of(table)):
        return Admission(True, digest=digest)
    present = None if store.present is None else \
        (lambda instances: store.present_cells(instances, width))  # noqa: E731
    findings = audit.judge(store, list(parts), np.full(len(parts), -1), p, present, width,
                           np.asarray(carried, dtype=bool))
    if findings:
        rests_on = [np.asarray(getattr(reason, "instances", ()), dtype=np.int64)
                    for _, reason in findings]
        return Admission(False, str(findings[0][1]), instances=np.unique(np.concatenate(rests_on)))
    store.add_report(table, digest, list(parts), p, carried, whole, snapped)
    store.save()
    return Admission(True, digest=digest)


def admit(task: str, groups: SiteGroups, floor: int) -> None:
    """Refuse, before it runs, a task whose reply is over all the site's rows when the
    site holds fewer than ``floor`` rows (``floor.WHOLE_SITE``)."""
    if task in floor_rules.WHOLE_SITE:
        floor_rules.refuse_under_floor(groups.n_rows, floor, groups.source,
                                       floor_rules.WHOLE_SITE[task])


def basis(task: str, groups: SiteGroups, private: bool) -> dict:
    """What a reply is as a function of the site's data (module docstring, 2)."""
    out = {"table": groups.digest[:16], "p-site": int(groups.min_size)}
    if groups.table_ref is not None:
        out["table-number"] = int(groups.table_ref.number)
        if groups.table_ref.partition is not None:
            out["partition"] = groups.table_ref.partition[:16]
    if private:
        out["rows"] = "clipped, noised"
    else:
        out["statistics"] = list(STATISTICS.get(task, _ALL))
    return out


def screen(reply: TaskReply, task: str, floor: int, groups: SiteGroups,
           private: bool = False) -> TaskReply:
    """``reply`` as it may leave: its rules applied at ``floor`` (a DP reply, whose floor
    is on its noisy counts, has none), its basis attached; the evaluation it carries
    (``evaluate-too``) screened alike."""
    arrays, metrics = floor_rules.apply(reply, floor)
    evaluation = None if reply.evaluation is None else \
        screen(reply.evaluation, "evaluate", floor, groups, private)
    return dataclasses.replace(reply, arrays=arrays, metrics=metrics, rules=(),
                               evaluation=evaluation, basis=basis(task, groups, private))


def leave(reply: TaskReply, task: str, config, n_rows: int, site_key: str, write,
          policy: dict | None = None) -> tuple:
    """Flower's (arrays, num_examples, metrics) for a screened ``reply``, after ``write``
    (the site's ledger writer: ``ledger.entry`` fields) has recorded it; ``policy``: the
    site's own figures a plain reply carries too (its rounds left, its group size)."""
    if secure.SECURE_PARAM in config:
        # Secure round: only the encoded terms leave the site, masked by SecAgg+;
        # num_examples is SecAgg+'s weight factor (1) and no per-site metric is sent.
        arrays = secure.encode(task, reply.arrays, reply.metrics, n_rows,
                               str(config[secure.SECURE_PARAM]), reply.terms)
        write(basis=reply.basis,
              secure={"terms": json.loads(str(config[secure.SECURE_PARAM]))["terms"],
                      "length": int(sum(np.size(a) for a in arrays))})
        return arrays, secure.WEIGHT, {protocol.SITE_KEY: site_key}
    arrays, metrics = reply.wire()
    metrics[protocol.SITE_KEY] = site_key
    metrics.update(policy or {})
    write(basis=reply.basis, n_rows=n_rows,
          values=values_of(reply.arrays, reply.evaluation and reply.evaluation.arrays),
          metrics=metrics)
    return arrays, n_rows, metrics
