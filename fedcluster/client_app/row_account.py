"""What a site says of its rows: how many of its usable rows it answers from, how many
wait in no group and how many the versions audit held back, and why (its log and
``fedcluster site check``; the coordinator reads the same counts from ``describe``).
"""

from __future__ import annotations

from fedcluster.client_app.data.versions import joining
from fedcluster.client_app.site_groups import SiteGroups

__all__ = ["waiting_text"]


def waiting_text(groups: SiteGroups) -> str:
    """What the site says of its rows in no group (its log, ``site check``): how many of
    its usable rows it answers from, how many wait and how many the audit held back."""
    waiting, held = groups.waiting - groups.held_back, groups.held_back
    parts = []
    if waiting:
        parts.append(f"{waiting} row(s) wait, in no group (no task uses them): new rows until "
                     f"there are {groups.min_size} of them, the other rows of a withdrawn group "
                     f"and corrected rows until {joining.host_size(groups.min_size)} new rows "
                     "come to take them in (versions of the data)")
    if held:
        parts.append(f"{held} row(s) held back by the versions audit ({groups.held_back_why}): "
                     "a later version, with new rows around them, tries again")
    return (f"answers from {groups.n_rows} of its {groups.n_rows + groups.waiting} usable "
            "rows; " + "; ".join(parts))
