"""One answered history read by two federations (issue 55, must-show 1).

Every SuperNode of one OS user keeps its answered history in the default cache, one per
way of reading the data: a tutorial run with 2 sites, then with 3 (the same columns, the
same site ids, one cache dir) reads rows the first federation's sites answered from,
cut anew. Before, a new version kept only the LAST table's groups and the rows of the
groups the new cut split waited for fresh rows that never came: on this test's data the
second federation's sites answered from 353, 135 and 325 of their 599 rows, the first
federation's first site read again from 847 of its 899, and nothing at the coordinator
said so.

Here, through the real ClientApp and its cache, as a deployed site reads its file:

- every site of both federations answers from at least 98% of its rows (a version keeps
  the groups of ANY earlier table whose rows are all there; the rows of a split group
  make groups of whole parts, which the audits judge), and the first federation's files
  read again answer from all their rows (the groups of their first tables, bit for bit);
- the audit still passes: an SVD of everything the sites answered from, over the rows
  as this test knows them, isolates no row;
- the run summary and ``model.json`` account for every row of every site.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import null_space
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from fedcluster.client_app.data import group_entries
from fedcluster.client_app.data.versions import row_keys
from fedcluster.common.datasets import load_builtin, partition
from fedcluster.server_app.outputs import summary_table
from fedcluster.simulation import run_in_process

# (the versions rule across federations; the report's parts, which later tables are
# audited with too, are measured in bench/clinical_report.py: report-groups off here)
RUN = {"n-clusters": 10, "num-rounds": 2, "seed": 0, "profile": False, "output-dir": "",
       "report-groups": False}


def _write(path: Path, X: np.ndarray, version: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(",".join(f"f{j}" for j in range(X.shape[1])) + "\n"
                    + "\n".join(",".join(repr(float(v)) for v in row) for row in X) + "\n")
    os.utime(path, ns=(version * 10**9, version * 10**9))
    return path


def _isolated(groups: list[frozenset]) -> list[int]:
    """The rows in the span of the groups' incidence (each group's sum known), by an SVD
    per connected component: a row is isolated when its row of the null space is 0."""
    rows = sorted(set().union(*groups))
    index = {r: i for i, r in enumerate(rows)}
    edges_g = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    edges_r = np.array([index[r] for g in groups for r in sorted(g)]) + len(groups)
    size = len(groups) + len(rows)
    _, label = connected_components(coo_matrix((np.ones(edges_g.size), (edges_g, edges_r)),
                                               shape=(size, size)), directed=False)
    out = []
    for c in np.unique(label[:len(groups)]):
        members = np.flatnonzero(label[len(groups):] == c)
        comp = np.flatnonzero(label[:len(groups)] == c)
        A = np.zeros((comp.size, members.size))
        for i, g in enumerate(comp):
            A[i, np.searchsorted(members, [index[r] for r in groups[g]])] = 1.0
        N = null_space(A)
        out += [rows[m] for k, m in enumerate(members) if np.linalg.norm(N[k]) < 1e-9]
    return out


def test_two_federations_through_one_cache_answer_from_their_rows(tmp_path):
    X, y = load_builtin("digits", seed=0)
    X, first = np.unique(X, axis=0, return_index=True)  # (a row is its content: no twins)
    y = y[first]
    cache = tmp_path / "cache"
    answered_from: list[tuple[str, int, int]] = []
    summaries = []
    version = 0
    for n_sites in (2, 3, 2):
        version += 1
        nodes = []
        for i, rows in enumerate(partition(y, n_sites, "iid", seed=0)):
            path = _write(tmp_path / f"federation-{n_sites}" / f"site-{i}.csv", X[rows], version)
            nodes.append({"data-path": str(path), "site-id": str(i), "cache-dir": str(cache),
                          "ledger-path": "off"})
        model = run_in_process(nodes, dict(RUN)).model
        accounts = model.metrics["site-rows"]
        for i, rows in enumerate(partition(y, n_sites, "iid", seed=0)):
            account = accounts[str(i)]
            assert account["usable"] == rows.size  # every row of the file accounted for
            answered_from.append((f"{n_sites} sites, site {i}", account["answered"], rows.size))
        summaries.append(summary_table(model.metrics))
    for name, answered, rows in answered_from:
        assert answered >= 0.98 * rows, f"{name}: answers from {answered} of {rows} rows"
    assert all(answered == rows for _, answered, rows in answered_from[-2:])  # read again
    assert "rows answered from:" in summaries[1]
    # the audit, re-run here: every group every site answered from, over digits' rows
    content = {tuple(k): r for r, k in enumerate(row_keys.content_keys(X).tolist())}
    groups = set()
    for sidecar in (cache / "groups").glob("*.json"):
        read = group_entries.read_arrays(sidecar.with_suffix(""))
        if read is None:
            continue
        _, parts = read
        row_of = np.array([content[tuple(k)] for k in np.asarray(parts["row-hashes"]).tolist()])
        of_row = np.asarray(parts["row-groups"])
        for g in np.unique(of_row[of_row >= 0]):
            groups.add(frozenset(row_of[of_row == g].tolist()))
    assert len(groups) > 600
    assert _isolated(sorted(groups, key=sorted)) == []


@pytest.mark.parametrize("answered, waiting, held", [(95, 3, 2), (100, 0, 0)])
def test_the_summary_names_what_a_site_held_back(answered, waiting, held):
    """The summary's account: all rows, or the site's figure and the audit's reason."""
    rows = {"answered": answered, "waiting": waiting, "held-back": held,
            "usable": answered + waiting + held}
    if held:
        rows["held-back-why"] = "a combination of the groups isolates 1 row(s), fewer than 2"
    text = summary_table({"site-rows": {"0": rows, "1": {**rows, "answered": 50, "usable": 50,
                                                          "waiting": 0, "held-back": 0}}})
    if held:
        assert ("site 0 answers from 95 of 100 usable rows; 3 wait in no group; 2 held back "
                "by the versions audit (a combination of the groups isolates 1 row(s)") in text
        assert "145 of 150 usable rows (96.7%)" in text
    else:
        assert "rows answered from: all 150 usable rows of the 2 sites" in text


def test_a_floor_raised_over_answered_rows_says_the_audit_held_them_back(tmp_path, monkeypatch):
    """The hospital tables answered from at p 2, then the same files at p 10 under the
    same cache (a newcomer trying the tutorial's hospital floor). Where the groups of 2
    leave present cells alone (as every site's did before groups were merged to keep
    them, ``present_groups.py``, put back here), every grouping of their rows at 10 would
    give a cell back in combination with them (a cell alone in its group of 2 withheld
    there, present in the group of 10), so the audit holds every row back. The site says
    so, naming the audit and its finding (it said it held "fewer than 10" rows); a cache
    of its own answers from every row at 10. With the merging, one cache answers from
    every row at both floors."""
    from fedcluster.client_app.data import present_groups
    from fedcluster.common.clinical_demo import write_clinical
    from fedcluster.strategies.errors import FederationError

    schema, *files = write_clinical(tmp_path / "clinical", n_sites=3, seed=0)
    config = {"n-clusters": 4, "min-sites": 3, "scale": "standard", "schema": str(schema),
              "num-rounds": 2, "profile": False, "output-dir": ""}

    def nodes(floor, cache):
        return [{"data-path": str(f), "schema-path": str(schema), "site-id": str(i),
                 "min-cluster-size": floor, "cache-dir": str(cache)} for i, f in enumerate(files)]

    def answered_all(result):
        return all(rows["answered"] == rows["usable"] for rows in result.metrics["site-rows"].values())

    with monkeypatch.context() as unmerged:
        unmerged.setattr(present_groups, "merge_lone_groups", lambda labels, *_: labels)
        run_in_process(nodes(2, tmp_path / "cache"), config)
        with pytest.raises(FederationError) as refused:
            run_in_process(nodes(10, tmp_path / "cache"), config)
        message = str(refused.value)
        assert message.count("the versions audit held back") == 3, message
        assert "fewer than 10: they make no group" not in message
        assert answered_all(run_in_process(nodes(10, tmp_path / "cache-p10"), config))
    run_in_process(nodes(2, tmp_path / "merged"), config)
    assert answered_all(run_in_process(nodes(10, tmp_path / "merged"), config))


@pytest.mark.parametrize("p", [4, 5])
def test_a_file_cut_anew_from_earlier_files_rows_holds_none_back(tmp_path, p):
    """The crafted history of ``test_deployment.hold_back_history`` under the versions
    rule's own grouping: earlier files answered from the first half of a site's rows, the
    second half with another site's rows, then those other rows alone; then the site's
    whole file. Its second half can only make groups of parts of earlier groups. The
    audit of the release before gave up on such components (20,000+ combinations) and
    held most of the rows back; the one audit decides them, and every row is answered."""
    from fedcluster.client_app.data import group_table
    from fedcluster.client_app.data.site_data import load_site_file

    X, y = load_builtin("digits")
    parts = partition(y, 3, "iid", seed=0)
    site, other = X[parts[2]], X[parts[0]][:300]

    def csv(name, rows):
        path = tmp_path / f"{name}.csv"
        header = ",".join(f"x{j}" for j in range(rows.shape[1]))
        np.savetxt(path, rows, delimiter=",", header=header, comments="", fmt="%.17g")
        return path

    half = len(site) // 2
    cache = tmp_path / "cache"
    for name, rows in (("a", site[:half]), ("b", np.vstack([site[half:], other])), ("c", other)):
        group_table.site_groups(load_site_file(csv(name, rows), cache_dir=cache), p, cache)
    groups, _ = group_table.site_groups(load_site_file(csv("final", site), cache_dir=cache), p, cache)
    assert (groups.held_back, groups.waiting) == (0, 0), groups.held_back_why
    assert int(groups.counts.sum()) == len(site)
