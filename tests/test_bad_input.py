"""A site with bad data is rejected with a message naming the problem; the run goes on
without it, or stops with that message when fewer than min-sites remain."""

import numpy as np
import pytest

from fedcluster.simulation import run_in_process
from fedcluster.strategies import FederationError


def write_csv(path, X, header=None):
    header = header or ",".join(f"f{j}" for j in range(X.shape[1]))
    np.savetxt(path, X, delimiter=",", header=header, comments="", fmt="%.17g")
    return str(path)


@pytest.fixture()
def good_sites(tmp_path):
    rng = np.random.default_rng(0)
    return [write_csv(tmp_path / f"good{i}.csv", rng.normal(size=(60, 3)) + 5 * i) for i in range(2)]


def bad_missing(tmp_path):
    return str(tmp_path / "nope.csv"), "nope.csv"


def bad_empty(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    return str(tmp_path / "empty.csv"), "empty.csv"


def bad_text(tmp_path):
    (tmp_path / "text.csv").write_text("f0,f1,f2\n1,2,3\n4,abc,6\n7,8,9\n")
    return str(tmp_path / "text.csv"), "f1"


def bad_nan(tmp_path):
    (tmp_path / "nan.csv").write_text("f0,f1,f2\n1,2,3\n4,5,nan\n7,8,9\n")
    return str(tmp_path / "nan.csv"), "f2"


def bad_inf(tmp_path):
    (tmp_path / "inf.csv").write_text("f0,f1,f2\n1,2,3\ninf,5,6\n7,8,9\n")
    return str(tmp_path / "inf.csv"), "f0"


def bad_few_rows(tmp_path):
    (tmp_path / "one.csv").write_text("f0,f1,f2\n1,2,3\n")
    return str(tmp_path / "one.csv"), "site policy min-site-rows=10: this site holds 1 rows"


def bad_width(tmp_path):
    path = write_csv(tmp_path / "wide.csv", np.ones((30, 4)))
    return path, "has 4 columns but the other sites have 3"


CASES = [bad_missing, bad_empty, bad_text, bad_nan, bad_inf, bad_few_rows, bad_width]
CONFIG = {"n-clusters": 2, "num-rounds": 3, "init": "random", "output-dir": ""}
# init "random" without data-bounds: the sites send their minima and maxima (allowed here)


@pytest.mark.parametrize("make_bad", CASES, ids=lambda f: f.__name__)
def test_bad_site_is_dropped_and_run_goes_on(tmp_path, good_sites, make_bad):
    bad_path, expected = make_bad(tmp_path)
    nodes = [{"data-path": p, "site-id": f"good{i}", "cache-dir": str(tmp_path / "cache")}
             for i, p in enumerate(good_sites)]
    nodes.append({"data-path": bad_path, "site-id": "bad", "cache-dir": str(tmp_path / "cache")})
    result = run_in_process(nodes, {**CONFIG, "min-sites": 2, "every-site": False})
    assert result.metrics["n-sites"] == 2
    assert result.metrics["n-rows"] == 120
    assert expected in result.metrics["rejected-sites"]["bad"]
    assert np.all(np.isfinite(result.centroids))


@pytest.mark.parametrize("make_bad", CASES, ids=lambda f: f.__name__)
def test_bad_site_stops_run_below_min_sites(tmp_path, good_sites, make_bad):
    bad_path, expected = make_bad(tmp_path)
    nodes = [{"data-path": p, "site-id": f"good{i}"} for i, p in enumerate(good_sites)]
    nodes.append({"data-path": bad_path, "site-id": "bad"})
    with pytest.raises(FederationError, match="2 usable site\\(s\\), but min-sites = 3") as info:
        run_in_process(nodes, {**CONFIG, "min-sites": 3})
    assert expected in str(info.value)


def test_unknown_run_config_key_is_named():
    from fedcluster.common.config import ConfigError

    with pytest.raises(ConfigError, match="unknown run-config key 'n-cluster'"):
        run_in_process([], {"n-cluster": 3})
    with pytest.raises(ConfigError, match="'fraction'"):
        run_in_process([], {"fraction": 1.5})


def test_site_with_other_column_names_is_rejected(tmp_path, good_sites):
    renamed = write_csv(tmp_path / "renamed.csv", np.ones((30, 3)), header="f0,f1,dose")
    nodes = [{"data-path": p, "site-id": f"good{i}"} for i, p in enumerate(good_sites)]
    nodes.append({"data-path": renamed, "site-id": "renamed"})
    result = run_in_process(nodes, {**CONFIG, "min-sites": 2, "every-site": False})
    assert "differ from the other sites' ['f0', 'f1', 'f2']" in result.metrics["rejected-sites"]["renamed"]
    assert result.model.feature_names == ["f0", "f1", "f2"]


def test_fewer_sites_than_min_sites_or_mismatched_labels_fail_at_once():
    """In process every site is given up front: fewer than min-sites (none at all, or one
    under the default 2) is an error before the run, not a wait for sites that cannot
    come (the ServerApp waited its 600 s startup timeout); labels must match the rows."""
    import fedcluster

    X = np.random.default_rng(0).normal(size=(50, 3))
    with pytest.raises(ValueError, match=r"^0 site\(s\) given, but min-sites = 2"):
        fedcluster.simulate([], n_clusters=2)
    with pytest.raises(ValueError, match=r"^1 site\(s\) given, but min-sites = 2"):
        fedcluster.simulate([X], n_clusters=2)
    assert fedcluster.simulate([X], n_clusters=2, min_sites=1).metrics["n-sites"] == 1
    with pytest.raises(ValueError, match=r"^site 1: labels of shape \(49,\) for its 50 rows"):
        fedcluster.simulate([X, X], labels=[np.zeros(50), np.zeros(49)], n_clusters=2)
    with pytest.raises(ValueError, match=r"^1 label arrays for 2 sites"):
        fedcluster.simulate([X, X], labels=[np.zeros(50)], n_clusters=2)
