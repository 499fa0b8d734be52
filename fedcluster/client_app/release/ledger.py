"""The disclosure ledger: one JSON line per reply a site sends or refuses (node config
``ledger-path``), so that the site's data-protection officer can see exactly what left.

Where: ``ledger-path`` when given (``off``: no ledger); else, for a site with a data
file, ``<cache-dir>/disclosure-ledger.jsonl``; a simulated site without ``ledger-path``
keeps none. Lines are appended under a lock and fsynced; the file is never rewritten.

A line (keys in kebab case):

``time``, ``run-id``, ``site``, ``round`` (the server's round number), ``task``, ``algorithm``
    Which reply this is.
``groups``
    The first 16 hex digits of the sha256 of the group table the reply came from
    (``site_groups.py``: every plain reply is a function of it), when loaded.
``basis``
    What the reply is as a function of the site's data (``gate.basis``): the table (its
    digest, and its number in the site's answered history, whose store holds each of
    its groups' rows and spread units), p_site, and which of the table's statistics
    (``counts``, ``sums``, ``spreads``), or under DP the site's rows, clipped and noised.
``rows``
    A differentially private reply (from the site's clipped rows): the first 16 hex
    digits of the rows' sha256, the key of the site's privacy budget.
``n-rows``, ``values``, ``metrics``
    A plain reply: the row count sent as Flower's ``num_examples``, every array sent
    by its protocol name (``common/protocol.py``; exact float64 values, as JSON numbers),
    and every scalar metric sent.
``secure``
    A SecAgg+ reply: only a masked share leaves the site. The line names the summed
    terms and the encoded vector's length; the values are not recorded, since what the
    server can learn is their sum over the sites, not this site's share.
``dp-rho``, ``budget``
    Under DP: the zCDP rho this reply spent, and the site's ``dp-budget`` after it.
``refused``
    A task the site refused, and why (no values were sent).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from fedcluster.client_app import site_files

class LedgerUnwritable(RuntimeError):
    """The ledger cannot be written: the site then answers no task (nothing leaves it
    unrecorded); the ClientApp refuses the task with this message, as it refuses by its
    policy."""


#: The node-config value that turns the ledger off.
OFF = "off"
#: The default file name in a site's cache directory.
DEFAULT_NAME = "disclosure-ledger.jsonl"


def entry(**fields) -> dict:
    """One ledger line: ``fields`` (kebab-case keys), stamped with the UTC time; the
    fields that are None are left out."""
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    line.update({key: value for key, value in fields.items() if value is not None})
    return line


def append(path: str | os.PathLike, line: dict) -> None:
    """Append ``line`` to the ledger at ``path`` (made with its directory if missing).

    Raises
    ------
    OSError
        The file cannot be written.
    """
    path = Path(path)
    text = json.dumps(line, default=_plain)
    with site_files.locked(path.parent, path.name) as target:
        site_files.append_line(target, text)


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def read(path: str | os.PathLike) -> list[dict]:
    """The ledger's lines.

    Raises
    ------
    ValueError
        The file is missing, or a line is not JSON (the message names the file and line).
    """
    if not Path(path).is_file():
        raise ValueError(f"disclosure ledger '{path}' does not exist (a site writes it at "
                         "node config ledger-path, by default <cache-dir>/"
                         f"{DEFAULT_NAME})")
    lines = []
    with open(path, encoding="utf-8") as ledger:
        for number, text in enumerate(ledger, start=1):
            if not text.strip():
                continue
            try:
                lines.append(json.loads(text))
            except ValueError as err:
                raise ValueError(f"{path}, line {number}: not a ledger line ({err})") from None
    return lines


def _numbers(value) -> int:
    return int(np.asarray(value, dtype=object).size) if isinstance(value, list) else 1


def summary(lines: list[dict], path: str = "") -> str:
    """What a data-protection officer reads: per run and site, the rounds answered, the
    tasks, how many numbers left the site (values and metrics), the refusals with their
    reasons, and the DP budget spent and left."""
    runs: dict = defaultdict(list)
    for line in lines:
        runs[(str(line.get("run-id", "?")), str(line.get("site", "?")))].append(line)
    out = [f"disclosure ledger {path}: {len(lines)} line(s), {len(runs)} run/site pair(s)"]
    for (run_id, site), items in runs.items():
        answered = [i for i in items if "refused" not in i]
        refused = [i for i in items if "refused" in i]
        tasks = Counter(i.get("task", "?") for i in answered)
        numbers = sum(_numbers(v) for i in answered for v in i.get("values", {}).values())
        numbers += sum(len(i.get("metrics", {})) for i in answered)
        secure = sum(1 for i in answered if "secure" in i)
        rho = sum(float(i.get("dp-rho", 0.0)) for i in answered)
        rounds = sorted({int(i["round"]) for i in answered if "round" in i})
        algorithm = next((i["algorithm"] for i in items if i.get("algorithm")), "?")
        tables = sorted({str(i["groups"]) for i in answered if "groups" in i and "rows" not in i})
        out.append(f"run {run_id} ({algorithm}), site {site}: {len(answered)} replies"
                   + (f" in rounds {rounds[0]}..{rounds[-1]}" if rounds else "")
                   + (f"; tasks {', '.join(f'{t} x{n}' for t, n in sorted(tasks.items()))}"
                      if tasks else ""))
        if tables:
            out.append(f"  from group table(s) {', '.join(tables)}")
        out.append(f"  disclosed: {numbers} numbers in plain replies"
                   + (f", {secure} masked SecAgg+ share(s) (only their sum is learnt)" if secure else "")
                   + (f"; DP rho spent {rho:.4g}" if rho else ""))
        for item in refused:
            out.append(f"  refused round {item.get('round', '?')} ({item.get('task', '?')}): "
                       f"{item['refused']}")
    budget = next((line["budget"] for line in reversed(lines) if "budget" in line), None)
    if budget is not None:
        out.append(f"privacy budget (as last recorded): epsilon {budget['spent-epsilon']:.4g} "
                   f"spent of {budget['budget-epsilon']:g} (delta {budget['budget-delta']:g}), "
                   f"{budget['remaining-epsilon']:.4g} remaining, over {budget['runs']} run(s)")
    return "\n".join(out)
