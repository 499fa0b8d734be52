"""The algorithms and their parameter rules: one card per algorithm, in the spirit of
scikit-learn's ``_parameter_constraints``.

Both sides read them: the run config validates against them (``common/config.py``: the
allowed ``algorithm`` values, ``init`` per algorithm, what ``auto`` means, which cannot
run under secure aggregation or DP), the site policy checks ``allow-algorithms`` against
them, and the strategy registry (``strategies/__init__.py``, ``STRATEGIES``) has one
strategy per card (a test checks both ways). The cards live in ``common`` because the
config, which both sides import, must validate against them; the strategies, which only
the server imports, cannot be imported from here. The contracts are in
docs/explanation/algorithms.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmCard:
    """One algorithm's parameter rules.

    Attributes
    ----------
    name : str
        The run-config value of ``algorithm``.
    paper : str
        Where it comes from.
    default_init, allowed_init : str, tuple of str
        What ``init = "auto"`` means, and the ``init`` values it accepts.
    default_weighted : bool
        What ``weighted = "auto"`` means (its k-FED round's server k-means).
    k_local_factor : int
        Local clusters per site of its k-FED round, as a multiple of k.
    secure_refused, dp_refused : str or None
        Why it cannot run under secure aggregation / differential privacy (None: it can).
    """

    name: str
    paper: str
    default_init: str
    allowed_init: tuple[str, ...]
    default_weighted: bool = False
    k_local_factor: int = 1
    secure_refused: str | None = None
    dp_refused: str | None = None


# k-FED proper (the one-shot algorithm) keeps its paper's choices: k local clusters per
# site, unweighted server k-means. As the initialisation of DWF, EWF and mini-batch the
# same round uses 2k local clusters and weights them by their counts: the union of the
# local centroids is then a weighted summary of the pooled data, and its k-means starts
# the training next to the central optimum. Measured on the DWF paper's synthetic
# benchmark (bench/rounds.py, 100 sites, 10 seeds): with k and unweighted, DWF needed up
# to 47 rounds to reach 1.001 x central (IID) and missed it in 1 seed of 10 on each
# split (stuck at 1.0016-1.0018); with 2k and weighted, it reached it within 2 rounds in
# all 20 runs. For DWF/EWF/mini-batch, `weighted` concerns only that round.
_WEIGHTED_KFED_START = dict(default_init="kfed", allowed_init=("kfed", "divisive", "random"),
                            default_weighted=True, k_local_factor=2)

CARDS: dict[str, AlgorithmCard] = {card.name: card for card in (
    AlgorithmCard("dwf", "Holzer, Jacob, Kavane 2023", **_WEIGHTED_KFED_START),
    AlgorithmCard("ewf", "Holzer, Jacob, Kavane 2023", **_WEIGHTED_KFED_START),
    AlgorithmCard(
        "minibatch", "Triebe & Rajagopal 2019", **_WEIGHTED_KFED_START,
        dp_refused="its sites' batch-by-batch updates are not a sum over rows (with one full "
                   "batch, epochs 1 and beta 1 it is DWF: use algorithm 'dwf')"),
    AlgorithmCard(
        "kfed", "Dennis, Li, Smith 2021", default_init="kfed", allowed_init=("kfed",),
        secure_refused="its server clusters the union of every site's local centroids, not "
                       "a sum",
        dp_refused="its sites send local k-means centroids run to convergence, which one row "
                   "can move arbitrarily (no bounded sensitivity)"),
    # FKM starts from the weighted k-FED round (2k local clusters) rather than its paper's
    # k-means++ seeds: bench/quality.py (21 sets, IID, floor 1) measured 1.01-1.03 x central
    # on four sets from the seeds, <= 1.004 on them from the k-FED round.
    AlgorithmCard(
        "fkm", "Garst & Reinders 2024", default_init="kfed",
        allowed_init=("kmeans++", "random", "kfed"), default_weighted=True, k_local_factor=2,
        secure_refused="its server step runs weighted k-means on every site's own centroids "
                       "(and the sites prune clusters), which needs each site's reply, not "
                       "their sum",
        dp_refused="its sites send k-means++ seeds' clusters and several local Lloyd "
                   "iterations, which have no bounded sensitivity"),
    # FFCM starts from the sum-only divisive start in every mode: measured with
    # bench/quality.py (21 sets, IID and label skew, floor 1), its fuzzy objective was
    # <= 1.015 x central fuzzy c-means at the 90th percentile (worst 1.054), against 1.06-1.2
    # (worst 3.5, a set with outliers; 1.3-1.5 on digits) from the k-FED round.
    AlgorithmCard(
        "ffcm", "Stallmann & Wilbik 2022", default_init="divisive",
        allowed_init=("random", "kfed", "divisive"),
        dp_refused="its fuzzy sums are not privatised yet (avg2 also clusters the sites' "
                   "centres)"),
    AlgorithmCard(
        "gtv", "Jung (GTVMin)", default_init="kmeans++", allowed_init=("kmeans++",),
        secure_refused="each site exchanges its own centroids with its graph neighbours; "
                       "there is no sum over sites to protect",
        dp_refused="its sites run many local updates and share their own models with "
                   "neighbours, which have no bounded sensitivity"),
)}

ALGORITHMS: tuple[str, ...] = tuple(CARDS)
