"""The phases of a run, defined once (issue 57).

A strategy is always in one phase; the phase says which task its next round sends
(``ClusteringStrategy.PHASE_TASKS``) and how that round's replies are reduced. A run goes
``describe`` -> (``impute`` -> ``stats``) -> per repetition ``init`` -> ``train`` (with
``interim`` evaluations every ``eval-every`` rounds; GTV adds ``refine``) -> ``evaluate``
-> (``distances``, Davies-Bouldin's second pass) -> (``profile-range``) -> ``profile`` ->
``done``. A resumed run goes through ``describe`` again, then back to the phase its
checkpoint was in.

:class:`Phase` is a :class:`~enum.StrEnum`: a phase equals its name as a string, so a
checkpoint keeps writing (and reading) the phase as the plain string it always was.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """One phase of a run (module docstring)."""

    DESCRIBE = "describe"
    IMPUTE = "impute"
    STATS = "stats"
    INIT = "init"
    TRAIN = "train"
    INTERIM = "interim"
    REFINE = "refine"
    EVALUATE = "evaluate"
    DISTANCES = "distances"
    PROFILE_RANGE = "profile-range"
    PROFILE = "profile"
    DONE = "done"


#: The phases of Table 1's profile: the range round (when needed), then the profile round.
PROFILE_PHASES = (Phase.PROFILE_RANGE, Phase.PROFILE)
#: The phases whose round is a secure sum under SecAgg+; describe, impute and stats run
#: plain, and init is secure when its task is a sum (``ClusteringStrategy.is_secure_round``); the
#: range round is never secure (under SecAgg+ the histograms span the data bound's box).
SECURE_PHASES = (Phase.TRAIN, Phase.EVALUATE, Phase.INTERIM, Phase.DISTANCES, Phase.PROFILE)
