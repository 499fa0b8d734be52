"""Secure aggregation: the sum-only rounds under Flower's SecAgg+ (``secure-aggregation``).

What Flower's SecAgg+ computes (flwr 1.39, ``SecAggPlusWorkflow`` + ``secaggplus_mod``):
every site of the round clips each entry of each of its arrays to [-c, c], maps it to
(x + c) T / (2c) and rounds it *stochastically* to an integer in [0, T] (T = the
quantisation range), multiplies nothing (weight factor: ``num_examples / max_weight``;
here both are 1, so the factor is exactly 1), adds pairwise and private masks mod M =
2**32 and uploads. The server adds the masked vectors mod M, removes the masks (the
sites' Shamir shares) and dequantises: for N contributing sites it passes
(sum_i q_i 2c/T - N c) / N -- the MEAN of the dequantised values -- to
``Strategy.aggregate_fit``, as the parameters of every site's FitRes (all alike).

So SecAgg+ gives sums if the sites' values are scaled into [-c, c] with a scale agreed
beforehand. The encoding here (c = 1):

- the server sends, with the task, the names of the *terms* it needs and one scale
  s_a per term, s_a a bound on |x| for every entry x of that term at every site of the
  round (``term_bounds``);
- a site computes the task as usual, forms the terms (per-cluster sums w_j c_j, counts
  w_j, ...), divides each by its scale and sends them with ``num_examples`` = 1; a value
  outside [-1, 1] would be clipped, so the site refuses instead (error reply, naming
  ``secagg-data-bound``);
- the server multiplies Flower's mean by N and by s_a: the sum of the term over the N
  sites (``decode``), then rounds the integer terms (counts).

Error bound. Stochastic rounding moves each site's encoded entry by less than one
quantisation step 2c/T, so a decoded sum differs from the exact sum by less than
``N * 2 * s_a / T`` (``quantisation_error``). Counts are exact after rounding when that
is < 1/2, i.e. when n_max < T / (4 N) (checked every round: ``check_exact_counts``).
The masks cancel exactly only while the integer sum stays below M: N T < 2**32
(checked every round too).

Distributed DP (``dp-epsilon`` with ``secure-aggregation``): a site's terms are its noisy
per-cluster sums and counts, formed by the task itself (``site_terms``'s ``own``); the
server widens their scales by ``NOISE_MARGIN`` standard deviations of one site's noise
and asks the sites to clip rather than refuse (``encode``); SecAgg+'s stochastic
rounding then applies to the noisy values, after the noise.
"""

from __future__ import annotations

import json
import math

import numpy as np

from fedcluster.common import protocol

# Encoded values lie in [-CLIP, CLIP] (Flower's clipping range); the scales carry the units.
CLIP = 1.0
# The masks' modulus (Flower's default and largest: masks are drawn below it).
MODULUS = 2**32
# Flower's weight factor is num_examples / max_weight: 1 / 1, exactly 1 for every site.
WEIGHT = 1

# Terms whose sums are integers (rounded after decoding; exact, see check_exact_counts).
INTEGER_TERMS = {"n", "w-int", "counts", "hidden",
                 *(protocol.PROFILE_TERM + name for name in ("counts", "rows", "present",
                                                            "histograms", "hidden",
                                                            "withheld"))}
# (The phases whose round is a secure sum: ``strategies/phases.SECURE_PHASES``.)

SECURE_PARAM = "secure"  # the task parameter that asks a site for encoded terms
# Distributed DP: a noisy term's scale is widened by this many standard deviations of one
# site's share of the noise (P(|N(0, 1)| > 10) = 1.5e-23), so clipping is never hit in
# practice (``encode``).
NOISE_MARGIN = 10.0


class SecureAggregationError(ValueError):
    """A site cannot encode its terms within the agreed scales (or the request is bad)."""


# ------------------------------------------------------------------- site side
def site_terms(task: str, arrays, metrics: dict, n_rows: int,
               own: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every term a site can contribute for ``task``, from its plain reply (``arrays``,
    the task's reply as ``common/protocol.py`` names it), or ``own``: the
    terms a task formed itself (distributed DP: its noisy per-cluster sums and counts,
    which no plain reply carries; ``client_app/private_tasks.py``)."""
    terms: dict[str, np.ndarray] = {"n": np.array([float(n_rows)])}
    for key in ("sse", "silhouette-sum", "group-scatter", "all-sq-dist", "partition-sum"):
        if key in metrics:
            terms[key] = np.array([float(metrics[key])])
    if own is not None:
        terms.update({name: np.asarray(value, dtype=np.float64) for name, value in own.items()})
        return terms
    terms.update(protocol.secure_terms(task, arrays))
    return terms


def encode(task: str, arrays: list[np.ndarray], metrics: dict, n_rows: int, request: str,
           own: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """The arrays a site hands to SecAgg+: each requested term divided by its scale.

    A term outside its scale makes the site refuse the round, except in a private run
    (the request's ``clip``, sent with distributed DP): there the server widened every
    noisy term's scale by a margin of ``NOISE_MARGIN`` standard deviations of one
    site's noise, and the rows are clipped to a box inside the data bound, so only the
    noise can carry a value past it (probability < 2e-23 per entry). Such a value is
    clipped: refusing would tell the server that this site's noisy value was extreme,
    one bit that depends on the data and is outside the DP guarantee, while clipping
    changes the sum's distribution by at most that probability (folded into delta).
    """
    try:
        wanted = json.loads(request)
        names = list(wanted["terms"])
        # a scale per term, or per feature of a term (a list: the profile's sums)
        scales = [np.asarray(s, dtype=np.float64) for s in wanted["scales"]]
        clip = bool(wanted.get("clip", False))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise SecureAggregationError(f"bad task parameter '{SECURE_PARAM}': {request!r}") from None
    if len(names) != len(scales) or any(
            s.ndim > 1 or not (np.all(s > 0) and np.all(np.isfinite(s))) for s in scales):
        raise SecureAggregationError(f"bad task parameter '{SECURE_PARAM}': {request!r}")
    terms = site_terms(task, arrays, metrics, n_rows, own)
    out = []
    for name, scale in zip(names, scales):
        if name not in terms:
            raise SecureAggregationError(f"task {task} has no term {name!r} to sum")
        try:
            value = np.asarray(terms[name], dtype=np.float64) / scale
        except ValueError:
            raise SecureAggregationError(f"term {name!r}: {scale.size} scales do not fit its "
                                         f"shape {np.shape(terms[name])}") from None
        if not np.all(np.isfinite(value)):
            raise SecureAggregationError(f"term {name!r} is not finite")
        if clip:
            value = np.clip(value, -CLIP, CLIP)
        elif np.any(np.abs(value) > CLIP):
            # Clipping would corrupt the sum silently: refuse. The message names no value.
            raise SecureAggregationError(
                f"term {name!r} exceeds its agreed scale {np.max(scale):g}: this site's data lie "
                "outside [-secagg-data-bound, secagg-data-bound]; raise the run-config key "
                "'secagg-data-bound'")
        out.append(value)
    return out


# ----------------------------------------------------------------- server side
def term_names(task: str, dynamic: bool = True, fuzzy_eval: bool = False,
               with_sse: bool = True) -> list[str]:
    """The terms the server needs for ``task`` (nothing more is summed)."""
    if task in ("lloyd", "minibatch", "fcm"):
        if task == "lloyd" and not dynamic:  # EWF: the plain mean of the sites' centroids
            names = ["c"]
        else:
            names = ["wc", "w" if task == "fcm" else "w-int"]
        return names + (["sse"] if with_sse else []) + ["n"]
    if task == "evaluate":
        names = ["counts", "sums", "sqnorms", "hidden", "distances", "sse", "silhouette-sum",
                 "group-scatter", "n"]
        return names + (["all-sq-dist", "partition-sum"] if fuzzy_eval else [])
    if task == "evaluate_distances":
        return ["distances", "n"]
    if task == "profile":
        return [protocol.PROFILE_TERM + name for name in protocol.ClusterProfile._fields] + ["n"]
    raise ValueError(f"task {task!r} is not a sum")


def term_bounds(names: list[str], centroids: np.ndarray, data_bound: float, n_max: int,
                means: np.ndarray | None = None) -> list[float]:
    """A bound on |x| for every entry x of each term at any site of the round.

    B = ``data-bound`` (|every feature of every row| <= B), n_max = the most rows of a
    site in the round, d = width, k = clusters, R = max(B, max |C|) (a local centroid is
    a mean of rows or the centroid it received), G = B + max |C| (|x - c| per feature).
    """
    k, d = centroids.shape
    B = float(data_bound)
    cmax = float(np.max(np.abs(centroids))) if centroids.size else 0.0
    R, G = max(B, cmax), B + cmax
    mmax = float(np.max(np.abs(means))) if means is not None and means.size else 0.0
    table = {
        "n": n_max, "w-int": n_max, "w": n_max, "counts": n_max, "hidden": 1.0,
        "wc": n_max * R, "c": R, "sums": n_max * B,
        "sqnorms": n_max * d * B * B, "sse": n_max * d * G * G,
        "group-scatter": n_max * d * 4 * B * B,
        "silhouette-sum": n_max, "partition-sum": n_max,
        "all-sq-dist": n_max * k * d * G * G,
        "distances": n_max * math.sqrt(d) * (B + mmax),
    }
    # A zero bound (no data, all-zero data) still needs a positive scale.
    return [max(float(table[name]), 1e-300) for name in names]


def profile_term_bounds(names: list[str], lower: np.ndarray, upper: np.ndarray,
                        references: np.ndarray, n_max: int) -> list:
    """The ``profile`` round's scales, per feature for its sums: every cell of encoded
    feature j in [lower_j, upper_j] (the schema's declared range, or the
    ``secagg-data-bound`` box in the encoded units), a sum is at most n_max E_j (E_j the
    larger |bound|) and a sum of squared deviations about a reference at most n_max W_j^2
    (W_j the span of the range and the references). Per feature, because a table's
    columns differ by orders of magnitude: one scale for all would drown the narrow
    ones in the quantisation of the widest."""
    lo = np.minimum(lower, references.min(axis=0))
    hi = np.maximum(upper, references.max(axis=0))
    per_feature = {"sums": n_max * np.maximum(np.abs(lo), np.abs(hi)),
                   "squares": n_max * (hi - lo) ** 2}
    out = []
    for name in names:
        field = name.removeprefix(protocol.PROFILE_TERM)
        if field in per_feature:
            out.append(np.maximum(per_feature[field], 1e-300).tolist())
        else:
            out.append(1.0 if field == "hidden" else float(max(n_max, 1)))
    return out


def reconstruction_threshold(n_sites: int, num_shares: float, threshold: float) -> int:
    """t: how many of a round's ``n_sites`` sites must contribute for SecAgg+ to produce
    the sum at all, for the run-config fractions ``secagg-num-shares`` and
    ``secagg-reconstruction-threshold`` (passed to Flower as floats).

    Flower's rule (``SecAggPlusWorkflow.setup_stage``, flwr 1.39; kept in step by a
    test): shares s = round(num_shares n), made odd when below n, n when at most 2;
    threshold = max(round(threshold s), 2). Every site's neighbourhood (s sites) must
    keep ``threshold`` active members through masking and unmasking, or the round halts
    before the sum is formed; so a produced sum has at least ``threshold`` contributors.
    """
    shares = round(float(num_shares) * n_sites)
    if shares < n_sites and shares % 2 == 0:
        shares += 1
    if shares <= 2:
        shares = n_sites
    return max(round(float(threshold) * shares), 2)


def quantisation_error(scale: float, n_sites: int, quantization_range: int) -> float:
    """The bound on |decoded sum - exact sum| per entry: N * 2c/T in encoded units."""
    return n_sites * 2.0 * CLIP / quantization_range * scale


def check_protocol_range(n_sites: int, n_max: int, quantization_range: int) -> str | None:
    """Why a secure round of ``n_sites`` sites would not be exact, or None."""
    if n_sites * quantization_range >= MODULUS:
        return (f"{n_sites} sites x secagg-quantization-range {quantization_range} must stay "
                f"below the SecAgg+ modulus 2**32; lower 'secagg-quantization-range'")
    if quantisation_error(n_max, n_sites, quantization_range) >= 0.5:
        return (f"counts would not be exact: {n_sites} sites with up to {n_max} rows need "
                f"'secagg-quantization-range' > {4 * n_sites * n_max}")
    return None


def decode(aggregate: list[np.ndarray], names: list[str], scales: list[float],
           n_sites: int) -> dict[str, np.ndarray]:
    """The sums over the ``n_sites`` contributing sites from what SecAgg+ passes on (the
    mean of the encoded terms): x N x scale, integer terms rounded."""
    if len(aggregate) != len(names):
        raise ValueError(f"the secure aggregate has {len(aggregate)} arrays, expected {len(names)}")
    out = {}
    for name, scale, value in zip(names, scales, aggregate):
        total = np.asarray(value, dtype=np.float64) * n_sites * np.asarray(scale, dtype=np.float64)
        out[name] = np.rint(total) if name in INTEGER_TERMS else total
    return out
