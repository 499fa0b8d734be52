"""convergence.png: a run's score and centroid movement per round, and its centroids."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcluster.common.model import Model


def plot_convergence(path: Path, model: Model) -> None:
    """convergence.png: :func:`convergence_figure`, saved."""
    import matplotlib.pyplot as plt

    fig = convergence_figure(model)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def convergence_figure(model: Model):
    """Score and centroid movement per training round, numbered as in history.csv (its
    ``round``), and a picture of the centroids (their 2 features, or the first 2
    principal components of the centroids). The movement axis is logarithmic above the
    smallest movement and linear below it, so a round that moved nothing (converged)
    shows at 0, as history.csv says. Rounds are whole numbers on both axes. The final
    score is drawn as a dashed line and named in its legend: it is the score of the
    centroids the last round returned (the ``evaluate`` round), so for Lloyd's steps it lies below
    the points, each the score of the centroids a round *received*."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    history = model.history
    fig, (ax_score, ax_move, ax_cent) = plt.subplots(1, 3, figsize=(15, 4.5))
    moved, rounds = [], set()
    for rep in sorted({r["repetition"] for r in history}):
        train = [r for r in history if r["repetition"] == rep and "movement" in r
                 and r["task"] not in ("evaluate", "evaluate_distances")]
        if not train:
            continue
        xs = [int(r["round"]) for r in train]
        rounds.update(xs)
        ax_score.plot(xs, [r["score"] for r in train], marker=".", label=f"repetition {rep}")
        moves = [float(r["movement"]) for r in train]
        moved += [m for m in moves if m > 0]
        ax_move.plot(xs, moves, marker=".", label=f"repetition {rep}")
    # linear below the least movement that is not rounding noise (1e-9 of the largest)
    ax_move.set_yscale("symlog", linthresh=min([m for m in moved if m > 1e-9 * max(moved)],
                                               default=1.0))
    ax_move.set_ylim(bottom=0)
    ax_score.set(xlabel="round (as in history.csv)",
                 ylabel="score = mean squared distance to nearest centroid",
                 title="Score of the centroids each round received")
    ax_move.set(xlabel="round (as in history.csv)",
                ylabel="||C_t - C_(t-1)||_F (data units; log above the least, 0 is 0)",
                title="Centroid movement (run stops below tol)")
    final = float(model.metrics.get("score", float("nan")))
    if np.isfinite(final):
        ax_score.axhline(final, color="0.3", linestyle="--", linewidth=1,
                         label=f"final score {final:.6g}: the centroids the last round\n"
                               "returned (each point: the centroids a round received)")
    for ax in (ax_score, ax_move):
        # a few rounds: each its own tick (a locator finds no two whole numbers in one
        # round's view and falls back to fractions); more: whole numbers only
        if len(rounds) <= 12:
            ax.set_xticks(sorted(rounds))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_score.legend(fontsize=8)
    ax_move.legend(fontsize=8)

    C = model.centroids
    sizes = np.asarray(model.metrics.get("cluster-sizes", [1] * len(C)), dtype=float)
    if C.shape[1] == 2:
        xy, axes = C, (model.feature_names or ["feature 0", "feature 1"])
        title = "Centroids (area = cluster size)"
    else:
        centred = C - C.mean(axis=0)
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        xy = centred @ vt[:2].T if len(vt) >= 2 else np.column_stack([centred @ vt[:1].T, np.zeros(len(C))])
        axes, title = ["PC 1 of the centroids", "PC 2 of the centroids"], "Centroids, PCA (area = cluster size)"
    area = 30 + 300 * sizes / max(sizes.max(), 1)
    ax_cent.scatter(xy[:, 0], xy[:, 1], s=area, alpha=0.6)
    for j, (x, y) in enumerate(xy):
        ax_cent.annotate(str(j), (x, y), ha="center", va="center", fontsize=8)
    ax_cent.set(xlabel=axes[0], ylabel=axes[1], title=title)
    fig.suptitle(f"{model.algorithm}: k = {model.n_clusters}, final score "
                 f"{model.metrics.get('score', float('nan')):.6g} (dashed line, left)")
    fig.tight_layout()
    return fig
