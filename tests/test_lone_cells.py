"""A coordinator that varies the fill, against a site whose table has missing cells.

A group keeps, per feature, the sum of its present cells, and a run fills a missing cell
with the value the server sends (``transform``). Two ``local_kmeans`` replies with as many
local clusters as the site has rows (every group its own cluster), under fills 0 and
0.001 (close enough that both list the groups in the same order), give each group's
missing cells per feature from the difference of its means, and so the sum of its present
cells: where a group holds one present cell of a feature, that
is one row's value, exactly. Shown first against a site without the rule and without
the merging of groups that keeps present cells in company (``data/present_groups.py``;
it reads hundreds of single values from the clinical demo), then against the real site,
where a
feature's present cells in a group number 0 or at least p_site
(``release/lone_cells.withhold_lone_cells``): the attack finds no group with 1 to p_site - 1
present cells, so every sum it reads is of p_site or more values.
"""

from __future__ import annotations

import numpy as np

from fedcluster import client_app as client_module
from fedcluster.client_app.data import group_table, present_groups
from fedcluster.client_app.data.schema_table import load_schema_table
from fedcluster.common.clinical_demo import write_clinical
from fedcluster.common.config import run_config_defaults
from fedcluster.common.scaling import FeatureTransform
from fedcluster.common.schema import load_schema
from fedcluster.simulation import InProcessGrid
from test_attacks import Coordinator

FILLS = (0.0, 1e-3)


class FileSite(Coordinator):
    """The coordinator of ``test_attacks``, against a site that reads a file through a
    schema (at its default node config but the cache directory)."""

    def __init__(self, node: dict) -> None:
        self.token = None
        self.grid = InProcessGrid(client_module.app, [node],
                                  {**run_config_defaults(), "algorithm": "dwf"})
        self.node_id = next(iter(self.grid.contexts))
        self.messages = 0
        self.server_floor = 1

    def close(self) -> None:
        pass


def read_present_sums(site: FileSite, n_rows: int, d: int):
    """Per group (a local cluster each) and feature: its present cells and their sum, as
    the two fills give them."""
    means = []
    for fill in FILLS:
        transform = FeatureTransform.fill_only(np.full(d, fill))
        (M, counts), _ = site.ask("local_kmeans", [], **{"k-local": n_rows, "seed": 0,
                                                         "transform": transform.encode()})
        means.append(M)
    missing = np.rint((means[1] - means[0]) * counts[:, None] / (FILLS[1] - FILLS[0]))
    return counts[:, None] - missing, means[0] * counts[:, None]


def test_a_coordinator_varying_the_fill_reads_no_lone_present_cell(tmp_path, monkeypatch):
    schema, path = write_clinical(tmp_path / "data", n_sites=1, seed=0)
    X = load_schema_table(path, load_schema(schema), cache_dir=tmp_path / "reread").X
    n_rows, d = X.shape
    assert np.isnan(X).any()

    def node(cache: str) -> dict:
        return {"data-path": str(path), "schema-path": str(schema), "site-id": "target",
                "cache-dir": str(tmp_path / cache)}

    # Without the rule (and without the merging that keeps present cells in company,
    # present_groups.py): single present cells, each exactly one row's value.
    monkeypatch.setattr(group_table, "withhold_lone_cells",
                        lambda sums, m2, present, size: (sums, m2, present, None))
    monkeypatch.setattr(present_groups, "merge_lone_groups", lambda labels, *_: labels)
    present, sums = read_present_sums(FileSite(node("without")), n_rows, d)
    lone = np.argwhere(present == 1)
    exact = [bool(np.any(np.abs(X[:, j] - sums[i, j]) <= 1e-9)) for i, j in lone]
    assert len(lone) > 100 and all(exact)  # the attack works
    monkeypatch.undo()

    present, sums = read_present_sums(FileSite(node("real")), n_rows, d)
    assert not np.any((present > 0) & (present < 2))  # every sum is of 2 or more values
    # and no present value is lost for it: the groups were merged to keep them company
    groups, _ = group_table.build(load_schema_table(path, load_schema(schema),
                                                   cache_dir=tmp_path / "reread"), 2)
    assert groups.cells_withheld == 0
    assert int(groups.present.sum()) == int((~np.isnan(X)).sum())


def test_a_column_too_rare_to_mend_is_still_withheld_against_the_attack(tmp_path):
    """Where a column holds fewer than p_site present cells in the whole site, no merge
    of groups can give them company (``present_groups.py``): the rule withholds them, and
    the attack of the test above reads none of them (a glucose recorded for one patient
    only, against the real ClientApp)."""
    import csv

    schema, path = write_clinical(tmp_path / "data", n_sites=1, seed=0)
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f))
    g = next(j for j, name in enumerate(header) if name.startswith("glucose"))
    kept = next(i for i, row in enumerate(rows) if row[g])
    for i, row in enumerate(rows):
        row[g] = row[g] if i == kept else ""
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    data = load_schema_table(path, load_schema(schema), cache_dir=tmp_path / "reread")
    j = next(k for k, name in enumerate(data.feature_names) if name == "glucose")
    assert int((~np.isnan(data.X[:, j])).sum()) == 1
    site = FileSite({"data-path": str(path), "schema-path": str(schema), "site-id": "target",
                     "cache-dir": str(tmp_path / "cache")})
    present, sums = read_present_sums(site, *data.X.shape)
    assert not present[:, j].any()  # the one glucose value is in no sum
    assert not np.any((present > 0) & (present < 2))
    groups, _ = group_table.build(data, 2)
    assert groups.cells_withheld == 1
