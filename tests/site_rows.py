"""Site tasks run on a site's rows as groups of one row (p_site = 1): the row-level
algorithm of each task, which the unit tests of the maths check against references."""

from __future__ import annotations

from fedcluster.client_app.data import group_table
from fedcluster.client_app.private_rows import PrivateRows
from fedcluster.client_app.data.site_data import SiteData
from fedcluster.client_app.task_runner import run_task


def run_on_rows(site: SiteData, arrays, params: dict, site_floor: int = 1, **kwargs):
    """``run_task`` on ``site``'s rows, each its own group (the site's opt-out)."""
    groups, grouped = group_table.site_groups(site, 1)
    return run_task(groups, arrays, params, site_floor,
                    private_rows=PrivateRows(site.X, grouped, site.source), **kwargs)


def run_on_groups(site: SiteData, arrays, params: dict, site_floor: int = 2, **kwargs):
    """``run_task`` on ``site``'s groups of at least ``site_floor`` rows (the default)."""
    groups, grouped = group_table.site_groups(site, site_floor)
    return run_task(groups, arrays, params, site_floor,
                    private_rows=PrivateRows(site.X, grouped, site.source), **kwargs)


def refuse_at(monkeypatch, task: str, source: str, reason: str) -> None:
    """Make the site whose data is ``source`` refuse ``task`` (every other site answers
    it as before): a site that cannot answer one task, as a test needs it."""
    from fedcluster.client_app import tasks
    from fedcluster.client_app.task_io import TaskError

    honest = tasks.TASKS[task]

    def refusing(site, arrays, params, floor):
        if site.source == source:
            raise TaskError(reason)
        return honest(site, arrays, params, floor)

    monkeypatch.setitem(tasks.TASKS, task, refusing)
