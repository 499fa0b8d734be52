"""What :func:`fedcluster.simulate` and :func:`fedcluster.choose_k` show while they run.

In a notebook a run's INFO lines (a line per round, the sites' notes, the summary) are
noise: by default they are held back from Flower's console and a progress bar (tqdm's,
a widget in Jupyter where ipywidgets is installed, else a line on stderr) counts the
rounds instead, with each round's task and score (the workflow tells it of each round:
``server_app/workflow.ROUND_LISTENERS``, whatever the loggers' levels). Warnings and
errors are shown as always, and every record still reaches Python's logging (a
notebook's own handler, pytest's ``caplog``). ``verbose=True`` shows every line, as
``fedcluster simulate`` does.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from flwr.common.logger import FLOWER_LOGGER

from fedcluster.server_app.workflow import ROUND_LISTENERS


class _RoundBar:
    """Moves the bar by each round (its history row, and the most rounds that may still
    follow it: a run stops early on convergence, so the bar's total shrinks as it goes)."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, row: dict, to_come: int) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=1 + to_come, unit="round", desc="fedcluster", leave=True)
        self.bar.total = self.bar.n + 1 + to_come
        score = row.get("score")
        self.bar.set_postfix_str(f"{row['task']}" + ("" if score is None else f", score {score:.6g}"),
                                 refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            # the bound is an upper bound (a run stops on convergence): full when done
            self.bar.total = self.bar.n
            self.bar.refresh()
            self.bar.close()


@contextmanager
def shown(verbose: bool):
    """Every line (``verbose``), or a progress bar and only warnings and errors."""
    if verbose:
        yield
        return
    consoles = [(h, h.level) for h in FLOWER_LOGGER.handlers]
    bar = _RoundBar()
    for handler, _ in consoles:
        handler.setLevel(max(handler.level, logging.WARNING))
    ROUND_LISTENERS.append(bar)
    try:
        yield
    finally:
        ROUND_LISTENERS.remove(bar)
        bar.close()
        for handler, level in consoles:
            handler.setLevel(level)
