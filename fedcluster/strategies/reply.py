"""A site's reply in the server's terms: :class:`Reply` (validated), what a task's reply
must look like (:class:`Expect`) and the error of one that does not validate
(``validation.py`` checks, ``round_replies.py`` takes a round's)."""

from __future__ import annotations

from dataclasses import dataclass, field


class ReplyError(ValueError):
    """A site's reply does not validate; the message says why."""


@dataclass
class Reply:
    """One validated site reply, in the server's terms."""

    site_key: str
    node_id: int
    n_rows: int
    arrays: tuple  # the task's reply type (common/protocol.py), validated
    metrics: dict = field(default_factory=dict)
    # How many sites this reply stands for: 1, or N for the decoded sum of a secure round.
    n_sites: int = 1
    # ``evaluate-too``: the site's evaluation of the centroids it received, validated
    evaluation: "Reply | None" = None


@dataclass(frozen=True)
class Expect:
    """What a task's reply must look like."""

    task: str
    n_features: int | None = None
    n_clusters: int | None = None  # rows of the centroid array (exact)
    max_rows: int | None = None  # rows of the centroid array (at most), for local_kmeans
    floor: int = 1
    declared_rows: int | None = None  # the size the site declared in its first reply
    scale: str | None = None  # the statistics round's kind: "standard" or "minmax"
    private: bool = False  # a DP run: a lloyd reply carries no SSE (it would not be private)
    far: bool = False  # a minibatch task asked for its farthest rows (protocol.FAR_ROWS)
