"""Checkpoints: the strategy's whole state after every round, and resuming a run from it.

The ServerApp writes ``<output-dir>/<run-name>/checkpoint.pkl`` after every round (atomically:
a temporary file renamed over the old one, so a crash mid-write leaves the previous
checkpoint). ``resume-from = "<that file or its directory>"`` in the run config of a new
run continues from it: the sites describe themselves again (node ids change when sites
or the SuperLink restart; site ids do not), each is matched to the checkpoint's site of
the same id, size and width, and the run goes on from the round after the checkpoint.
Every random draw of the strategies is a function of the seed and the round, so a
resumed run ends with the same model as an uninterrupted one (a test checks it).

A checkpoint is a pickle: resume only from checkpoints your own server wrote.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from fedcluster.common.config import ConfigError, RunConfig

CHECKPOINT_FILE = "checkpoint.pkl"
FORMAT_VERSION = 1
#: Run-config keys that may differ between the checkpointed run and the resumed one:
#: where to write, how long to wait. Everything that shapes the result must be equal.
OPERATIONAL_KEYS = ("resume-from", "run-name", "output-dir", "round-timeout")


def save_checkpoint(strategy, directory: Path) -> Path:
    """Write the strategy's state to ``directory/checkpoint.pkl``; return the path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump({"format-version": FORMAT_VERSION, "strategy": strategy}, fh,
                    protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    return path


def load_checkpoint(resume_from: str, config: RunConfig):
    """The strategy saved at ``resume_from`` (a checkpoint file or a run directory),
    ready to resume under ``config``.

    Raises
    ------
    ConfigError
        If there is no readable checkpoint there, or ``config`` differs from the
        checkpointed run's in a key that shapes the result (the message names them).
    """
    path = Path(resume_from).expanduser()
    if path.is_dir():
        path = path / CHECKPOINT_FILE
    try:
        with open(path, "rb") as fh:
            saved = pickle.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"run-config key 'resume-from': no checkpoint at {path}") from None
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as err:
        raise ConfigError(
            f"run-config key 'resume-from': {path} is not a readable fedcluster checkpoint ({err})"
        ) from None
    if not isinstance(saved, dict) or saved.get("format-version") != FORMAT_VERSION:
        raise ConfigError(
            f"run-config key 'resume-from': {path} is not a checkpoint of this fedcluster "
            f"version (format {saved.get('format-version') if isinstance(saved, dict) else '?'}, "
            f"expected {FORMAT_VERSION})"
        )
    strategy = saved["strategy"]
    before = strategy.config.model_dump(by_alias=True)
    now = config.model_dump(by_alias=True)
    changed = sorted(key for key in now if key not in OPERATIONAL_KEYS and before.get(key) != now[key])
    if changed:
        details = ", ".join(f"{key} = {before.get(key)!r} -> {now[key]!r}" for key in changed)
        raise ConfigError(
            f"run-config key 'resume-from': the run config differs from the checkpointed "
            f"run's in {details}; only {', '.join(OPERATIONAL_KEYS)} may change"
        )
    if strategy.finished:
        raise ConfigError(f"run-config key 'resume-from': the run in {path} had already finished")
    strategy.config = config
    strategy.begin_resume()
    return strategy
