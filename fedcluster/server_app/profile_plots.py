"""Pictures of a cluster profile (the tidy rows of :mod:`fedcluster.server_app.table1`):
``profile.png``, how each cluster differs from all rows, and ``sites.png``, each site's
cluster composition.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedcluster.server_app.table1 import ALL, SITE, SIZE, cluster_order
from fedcluster.server_app.table1_cells import format_count

# The colour scale stops here: a difference of 2 SD is already large for a clinician,
# and one extreme cell must not wash out every other.
CLIP = 2.0


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: A heatmap cell's text where every row has the same value (not a withheld cell).
CONSTANT = "constant"


def _index(rows: list[dict]) -> dict:
    return {(r["cluster"], r["variable"], r["level"], r["statistic"]): r["value"] for r in rows}


def _num(value) -> float:
    """A float, or NaN for a withheld ("<p", "suppressed"), interval ("a-b") or
    unavailable ("") cell."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def profile_matrix(rows: list[dict]) -> tuple[list[str], list[str], np.ndarray, list[str]]:
    """The heatmap's figures.

    Returns
    -------
    clusters : list of str
        Cluster ids, largest first.
    labels : list of str
        One per heatmap row: a numeric variable (with its unit) or ``"variable: level"``.
    Z : np.ndarray
        (rows, clusters) standardised differences from all rows, NaN where a cell is
        withheld (the small-cell rule: a mean whose n is withheld, a level's share whose
        count is) or unavailable. A numeric variable: (cluster mean - all mean) / all SD;
        a categorical level: the same for its 0/1 indicator, (cluster share - all share)
        / sqrt(share (1 - share)) of all rows, so both read on one scale.
    text : list of str
        Per cell, row-major: ``"constant"`` where every row has one value (an SD of 0, a
        share of 0 or 100%), ``""`` where withheld or unavailable, else the annotation, the figure the cell is coloured by (``Z``,
        in SD); for a level also, below it, the difference in percentage points, which a
        clinician reads directly.
    """
    index = _index(rows)
    clusters = cluster_order(rows)
    labels, values, text = [], [], []
    for variable in dict.fromkeys(r["variable"] for r in rows if r["variable"] not in (SIZE, SITE)):
        of_variable = [r for r in rows if r["variable"] == variable]
        levels = list(dict.fromkeys(r["level"] for r in of_variable if r["level"] != ""))
        if not levels:
            unit = next((r["unit"] for r in of_variable if r["unit"]), "")
            mean = _num(index.get((ALL, variable, "", "mean")))
            sd = _num(index.get((ALL, variable, "", "sd")))
            z = [(_num(index.get((c, variable, "", "mean"))) - mean) / sd if sd > 0 else math.nan
                 for c in clusters]
            labels.append(f"{variable} ({unit})" if unit else variable)
            values.append(z)
            # one value in every row (an SD of exactly 0): nothing to compare, and nothing
            # withheld either, so say so rather than leave it with the withheld cells
            text += [CONSTANT if sd == 0 else "" if math.isnan(v) else _signed(v) for v in z]
            continue
        for level in levels:
            share = _num(index.get((ALL, variable, level, "%"))) / 100
            spread = math.sqrt(share * (1 - share)) if 0 < share < 1 else math.nan
            diffs = [_num(index.get((c, variable, level, "%"))) / 100 - share for c in clusters]
            labels.append(f"{variable}: {level}")
            values.append([d / spread for d in diffs])
            text += [CONSTANT if share in (0, 1) else "" if math.isnan(d / spread)
                     else f"{_signed(d / spread)}\n{round(100 * d):+d} pp" for d in diffs]
    return clusters, labels, np.array(values, dtype=float).reshape(len(labels), len(clusters)), text


def _signed(value: float) -> str:
    """``+1.2``, ``-0.3``; a value that rounds to 0 reads ``0.0`` (not ``-0.0``)."""
    return "0.0" if round(value, 1) == 0 else f"{value:+.1f}"


def plot_profile(rows: list[dict], path: str | Path) -> Path:
    """Heatmap of how each cluster differs from all rows: one column per cluster, largest
    first, its size on top; one row per numeric variable and per categorical level.
    Withheld (``<p``, ``suppressed``: Table 1's small-cell rule), interval and unavailable
    cells are grey, marked ``n/a``; a variable with one value in every row is grey too,
    marked ``constant``.

    Returns
    -------
    Path
        ``path``, written.
    """
    plt = _pyplot()
    clusters, labels, Z, text = profile_matrix(rows)
    sizes = _index(rows)
    # Wide enough for the title and the colour bar's label at any k.
    fig, ax = plt.subplots(figsize=(max(8.0, 4.0 + 1.1 * len(clusters)),
                                    2.2 + 0.42 * max(len(labels), 1)))
    # grey: nothing to show (suppressed under the floor, or unavailable)
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="0.85")
    image = ax.imshow(np.ma.masked_invalid(Z), cmap=cmap, vmin=-CLIP, vmax=CLIP, aspect="auto")
    for i in range(len(labels)):
        for j in range(len(clusters)):
            label = text[i * len(clusters) + j]
            ax.text(j, i, label or "n/a", ha="center", va="center",
                    fontsize=7 if "\n" in label else 8,
                    color="0.4" if label in ("", CONSTANT) else ("white" if abs(Z[i, j]) > 1.3 else "black"))
    ax.set_xticks(range(len(clusters)))
    ax.set_xticklabels([f"Cluster {c}\nn {_size_text(sizes.get((c, SIZE, '', 'n')))}"
                        for c in clusters], fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=9)
    bar = fig.colorbar(image, ax=ax, shrink=0.8)
    bar.set_label("standardised difference from all rows, in SD\n(numeric: (cluster mean - all "
                  "mean) / all SD;\nlevel: the same for its 0/1 indicator)", fontsize=8)
    ax.set_title("How each cluster differs from all rows\n(cells: the colour's figure, in SD of "
                 "all rows; a level's also in percentage points below it;\ngrey n/a: withheld "
                 "as in Table 1 (<p, suppressed, or a % known only as a range) or not "
                 "available;\ngrey constant: one value in every row, nothing withheld)", fontsize=9, pad=34)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def _size_text(value) -> str:
    text = format_count("" if value is None else value)
    return f"{text[0]} {text[1:]}" if text.startswith("<") else f"= {text}"


def site_matrix(rows: list[dict]) -> tuple[list[str], list[str], np.ndarray, list[str]]:
    """Rows per cluster at each site.

    Returns
    -------
    sites, clusters : list of str
        Site names (first seen first) and cluster ids (largest first).
    counts : np.ndarray
        (sites, clusters); 0 where a cell is withheld (``<p``, ``suppressed``: left out of
        the bar) or missing.
    partial : list of str
        The sites with a withheld cell left out.
    """
    clusters = cluster_order(rows)
    site_rows = [r for r in rows if r["variable"] == SITE and r["statistic"] == "n"
                 and r["cluster"] != ALL and r["value"] != ""]
    sites = list(dict.fromkeys(r["level"] for r in site_rows))
    counts = np.zeros((len(sites), len(clusters)))
    partial = []
    for r in site_rows:
        if r["cluster"] not in clusters:
            continue
        value = _num(r["value"])
        if math.isnan(value):
            partial.append(r["level"])
        else:
            counts[sites.index(r["level"]), clusters.index(r["cluster"])] = value
    return sites, clusters, counts, list(dict.fromkeys(partial))


def plot_sites(rows: list[dict], path: str | Path) -> Path | None:
    """Each site's cluster composition as stacked horizontal bars (rows per cluster at that
    site, clusters largest first); withheld cells (Table 1's ``<p`` and ``suppressed``)
    are left out, and the title says which sites have cells left out.

    Returns
    -------
    Path or None
        ``path``, written; None, writing nothing, when the rows hold no per-site figure
        (secure aggregation: the server saw only sums over sites). The run report then
        says so in words.
    """
    sites, clusters, counts, partial = site_matrix(rows)
    if not sites:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.45 * len(sites)))
    left = np.zeros(len(sites))
    for j, cid in enumerate(clusters):
        ax.barh(range(len(sites)), counts[:, j], left=left, color=f"C{j % 10}",
                label=f"Cluster {cid}")
        left += counts[:, j]
    ax.set_yticks(range(len(sites)))
    ax.set_yticklabels([f"{s} *" if s in partial else s for s in sites], fontsize=9)
    ax.invert_yaxis()  # the first site on top, as in the table
    ax.set_xlabel("rows")
    title = "Rows per cluster at each site"
    if partial:
        title += (f"\n* {len(partial)} site(s) have cells withheld as in Table 1 (<p, "
                  "suppressed), left out of their bars")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
