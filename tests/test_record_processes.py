"""One record over REAL site processes (issue 69, must-show 1): a hospital in two
studies, one data file served by two SuperNodes (one per federation, each on its own
SuperLink) that share one cache directory, and the two studies' runs started together.

Each run's final report asks the hospital for a partition of its groups within that
run's model (the two models differ). The two SuperNodes' ClientApp processes judge their
partitions with the site's one record under its one lock: whichever comes second is
judged with the first. The suite's own audit (``record_check.py``) then reads the
hospital's record and finds nothing in its span (no combination of every group and part
the site released, in both studies, isolates a value or determines one), every ledger
line of both runs names a table or partition the record holds, and each run's figures
are those of the groups the hospital answered its report from. (The race itself, and
the row it gives without the lock, is shown deterministically by two processes at once
in ``test_record_attacks.py``; real SuperNodes meet at times no test chooses.)
"""

from __future__ import annotations

import threading

import numpy as np

import fedcluster
from fedcluster.client_app.release import ledger as disclosure_ledger
from record_check import RecordCheck, Version
from test_deployment import write_site_csv
from test_site_policy import APP_DIR

CONFIG = {"algorithm": "dwf", "n-clusters": 3, "num-rounds": 3, "min-sites": 2,
          "profile": False}


def _blobs(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0, 0.0], [4.0, 0.0, 1.0], [0.0, 4.0, -1.0]])
    return centres[rng.integers(0, 3, rows)] + rng.normal(0, 1.4, (rows, 3))


def test_two_studies_report_at_once_through_one_cache(bed, tmp_path):
    hospital = _blobs(400, 1)
    files = {name: write_site_csv(tmp_path / f"{name}.csv", X) for name, X in
             (("hospital", hospital), ("other-1", _blobs(300, 2)), ("other-2", _blobs(300, 3)))}
    shared = tmp_path / "hospital-cache"
    ledger = tmp_path / "hospital-ledger.jsonl"
    links = [bed.superlink(simulation=False) for _ in range(2)]
    for study, link in enumerate(links, start=1):
        bed.supernodes(link, {
            f"hospital-{study}": {"data-path": str(files["hospital"]), "site-id": "hospital",
                                  "cache-dir": str(shared), "ledger-path": str(ledger)},
            f"other-{study}": {"data-path": str(files[f"other-{study}"]), "site-id": "other",
                               "cache-dir": str(tmp_path / f"cache-{study}")}})
        bed.connect(f"study-{study}", link.control_address)
    out = tmp_path / "outputs"
    failures: list[BaseException] = []

    def study(number: int) -> None:
        try:
            bed.run(APP_DIR, f"study-{number}", {**CONFIG, "seed": number, "output-dir": str(out),
                                                "run-name": f"study-{number}"},
                    timeout=300, log_name=f"flwr-run-{number}")
        except BaseException as err:  # noqa: BLE001 (re-raised below, in the test's thread)
            failures.append(err)
    threads = [threading.Thread(target=study, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    models = [fedcluster.Model.load(out / f"study-{n}" / "model.json") for n in (1, 2)]
    assert not np.allclose(models[0].centroids, models[1].centroids)
    assert all(m.metrics["report-groups"] for m in models)

    (store,) = list((shared / "groups").glob("store-*"))
    record = RecordCheck(store)
    record.add_version(Version(hospital, np.arange(len(hospital)),
                               np.zeros(hospital.shape, dtype=np.int64)))
    assert record.entry_findings(shared) == []
    assert record.span_findings(3, 2) == []
    reports = record.meta.get("reports", {}).get("0", [])
    assert 1 <= len(reports) <= 2  # a partition per study, or the second one judged away
    partitions = {r["digest"][:16] for r in reports}
    lines = disclosure_ledger.read(ledger)
    assert {line["run-id"] for line in lines if "basis" in line} and len(
        {line["run-id"] for line in lines}) == 2
    for line in lines:
        basis = line.get("basis", {})
        assert basis.get("table-number", 0) == 0, line
        assert basis.get("partition") in (None, *partitions), line
    # each study's figures: the groups its sites answered the report from
    from fedcluster.client_app.data import report_table
    from fedcluster.client_app.data.site_data import load_site_file
    from fedcluster.common import kernels

    for number, model in enumerate(models, start=1):
        sizes = np.zeros(3, dtype=np.int64)
        for name, cache in (("hospital", shared), (f"other-{number}", tmp_path / f"cache-{number}")):
            site = load_site_file(files[name], cache_dir=cache)
            groups, _ = report_table.as_answered(site, 2, cache, model.centroids, None)
            sizes += np.bincount(kernels.assign(np.ascontiguousarray(groups.means),
                                                model.centroids)[0],
                                 weights=groups.counts, minlength=3).astype(np.int64)
        assert model.metrics["cluster-sizes"] == sizes.tolist(), number
