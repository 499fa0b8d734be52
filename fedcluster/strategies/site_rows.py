"""Every row of a site accounted for, as its describe reply gives it: the rows it answers
from, those a schema dropped (missing cells), those in no group yet and those the
versions audit held back, with the audit's reason (``common/protocol.py``:
``ROWS_WAITING``, ``ROWS_HELD_BACK``, ``HELD_BACK_WHY``). A site that answers from fewer
than all its usable rows is a warning here, with the figure; the run summary,
``model.json`` (``site-rows``), report.html and Table 1's note say it too.
"""

from __future__ import annotations

import json
import logging

from flwr.common.logger import log

from fedcluster.common import protocol

__all__ = ["account", "not_answered", "short_text", "warn"]


def account(reply) -> dict:
    """A site's rows from its describe reply: ``answered`` (num_examples), ``waiting``,
    ``held-back`` (and ``held-back-why``), ``usable`` (their sum) and, read through a
    schema, ``dropped`` (a count, or ``"<p"`` under the site's floor) and ``in-file``
    (usable + dropped, a number only where dropped is one)."""
    metrics = reply.metrics
    waiting = int(metrics.get(protocol.ROWS_WAITING, 0))
    held = int(metrics.get(protocol.ROWS_HELD_BACK, 0))
    rows = {"answered": int(reply.n_rows), "waiting": waiting, "held-back": held,
            "usable": int(reply.n_rows) + waiting + held}
    if held:
        rows["held-back-why"] = str(metrics.get(protocol.HELD_BACK_WHY, ""))
    if protocol.ROWS_DROPPED in metrics:
        try:
            dropped = json.loads(str(metrics[protocol.ROWS_DROPPED]))
        except ValueError:
            dropped = str(metrics[protocol.ROWS_DROPPED])
        rows["dropped"] = dropped
        rows["in-file"] = rows["usable"] + dropped if isinstance(dropped, int) \
            else f"{rows['usable']} + {dropped}"
    return rows


def not_answered(rows: dict) -> int:
    """How many of a site's usable rows it does not answer from."""
    return int(rows.get("waiting", 0)) + int(rows.get("held-back", 0))


def short_text(rows: dict) -> str:
    """One site's rows in a few words (the summary, the warning, report.html)."""
    text = f"answers from {rows['answered']} of {rows['usable']} usable rows"
    if "dropped" in rows:
        text += f" ({rows['in-file']} in the file, {rows['dropped']} dropped: missing cells)"
    if rows.get("waiting"):
        text += f"; {rows['waiting']} wait in no group"
    if rows.get("held-back"):
        text += (f"; {rows['held-back']} held back by the versions audit "
                 f"({rows.get('held-back-why', '')})")
    return text


def warn(key: str, rows: dict) -> None:
    """The coordinator's warning for a site that answers from fewer than all its usable
    rows."""
    if not_answered(rows):
        share = rows["answered"] / max(rows["usable"], 1)
        log(logging.WARNING, "site %s %s (%.1f%% of its usable rows): see its log and "
            "`fedcluster site check`", key, short_text(rows), 100 * share)
