"""Checkpoints: the strategy's whole state after every round, and resuming a run from it.

The ServerApp writes the checkpoint of ``<output-dir>/<run-name>/`` after every round, as
data (format 2):

- ``checkpoint.json``: the format version, the algorithm, the run config and the
  strategy's state (every attribute but the config, as typed JSON:
  ``fedcluster/strategies/state.py``);
- ``checkpoint-<round>.npz``: the state's numpy arrays, which the JSON names by key (it
  also names this file and holds its SHA-256).

Both are written to temporary files and renamed into place, the arrays first (under a
name the current JSON does not use) and the JSON last, and older ``.npz`` files are
removed only then: a crash mid-write leaves the previous complete checkpoint.

``resume-from = "<checkpoint.json or its directory>"`` in the run config of a new run
continues from it: the strategy is built afresh from the run config and the checkpoint's
state set into it; the sites describe themselves again (node ids change when sites or
the SuperLink restart; site ids do not), each is matched to the checkpoint's site of the
same id, size and width, and the run goes on from the round after the checkpoint. Every
random draw of the strategies is a function of the seed and the round, so a resumed run
ends with the same model as an uninterrupted one (a test checks it).

Loading a checkpoint runs no code: it is JSON and numeric arrays, and the decoder builds
only the few types ``strategies/state.py`` registers. A checkpoint of another format is
refused with both versions named, without being read; so is format 1, the
``checkpoint.pkl`` of earlier fedcluster versions (an object stream whose loading would
run code).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from fedcluster.common.schema import run_schema
from fedcluster.common.config import ConfigError, RunConfig
from fedcluster.strategies import make_strategy
from fedcluster.strategies.state import Encoder, Snapshot, StateError, decode

CHECKPOINT_FILE = "checkpoint.json"
FORMAT_VERSION = 2
#: Format 1's file (refused by name and never read).
FORMAT_1_FILE = "checkpoint.pkl"
#: Run-config keys that may differ between the checkpointed run and the resumed one:
#: where to write, how long to wait. Everything that shapes the result must be equal.
OPERATIONAL_KEYS = ("resume-from", "run-name", "output-dir", "round-timeout", "every-site")
#: Keys added after checkpoints were first written, with the value that gives the older
#: release's behaviour: a checkpoint written before a key existed resumes with that value
#: where the resuming config leaves the key at its default.
ADDED_KEYS = {"report-groups": False}
_KEY = "run-config key 'resume-from'"


def save_checkpoint(snapshot: Snapshot, directory: Path) -> Path:
    """Write a run's state (``Run.snapshot``) to ``directory/checkpoint.json`` and its
    arrays to ``directory/checkpoint-<round>.npz``; return the JSON's path.

    Raises
    ------
    fedcluster.strategies.state.StateError
        If the run holds a value that cannot be stored (``Run.snapshot`` names it).
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CHECKPOINT_FILE
    state, arrays = snapshot.document, snapshot.arrays
    config = Encoder().encode(snapshot.config.model_dump(by_alias=True), "config")
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    last_round = snapshot.last_round
    arrays_file = f"checkpoint-{last_round}.npz"
    if arrays_file == _arrays_file_of(path):  # never rewrite the current arrays in place
        arrays_file = f"checkpoint-{last_round}b.npz"
    _write_atomically(directory / arrays_file, data)
    document = {
        "format-version": FORMAT_VERSION,
        "algorithm": snapshot.config.algorithm,
        "round": last_round,
        "finished": snapshot.finished,
        "config": config,
        "arrays-file": arrays_file,
        "arrays-sha256": hashlib.sha256(data).hexdigest(),
        "strategy": state,
    }
    if (schema := run_schema(snapshot.config.schema_file)) is not None:
        document["schema-hash"] = schema[1]  # the schema may move; its content may not
    _write_atomically(path, json.dumps(document, allow_nan=False, indent=1).encode("utf-8"))
    for old in [*directory.glob("checkpoint-*.npz"), *directory.glob("checkpoint*.tmp")]:
        if old.name != arrays_file:
            old.unlink(missing_ok=True)
    return path


def load_checkpoint(resume_from: str, config: RunConfig):
    """The strategy saved at ``resume_from`` (a checkpoint file or a run directory),
    ready to resume under ``config``.

    Raises
    ------
    ConfigError
        If there is no readable checkpoint of this format there, ``config`` differs from
        the checkpointed run's in a key that shapes the result (the message names them),
        or the checkpointed run had finished.
    """
    path = _locate(resume_from)
    strategy = _restore(path, config)
    if strategy.finished:
        raise ConfigError(f"{_KEY}: the run in {path} had already finished")
    strategy.begin_resume()
    return strategy


def read_checkpoint(resume_from: str | Path, config: RunConfig):
    """The strategy saved at ``resume_from`` as it was saved (finished or not, not yet
    resumed), built for ``config``; ConfigError as :func:`load_checkpoint`."""
    return _restore(_locate(resume_from), config)


def _restore(path: Path, config: RunConfig):
    document = _read_document(path)
    try:
        before = decode(document.get("config"), {})
    except StateError as err:
        raise _unreadable(path, f"run config: {err}") from None
    if not isinstance(before, dict):
        raise _unreadable(path, "no run config")
    now = config.model_dump(by_alias=True)
    for key, older in ADDED_KEYS.items():
        if key not in before:  # written before the key existed: run on as that release did
            before[key] = older
            field = key.replace("-", "_")
            if now[key] == type(config).model_fields[field].default:
                config = config.model_copy(update={field: older})
                now[key] = older
    changed = sorted(key for key in now if key not in OPERATIONAL_KEYS and before.get(key) != now[key])
    if "schema" in changed and now["schema"] and document.get("schema-hash"):
        # the schema file moved (or simulate wrote it anew): the same content resumes
        held = run_schema(config.schema_file)[1]
        if held != document["schema-hash"]:
            raise ConfigError(f"{_KEY}: the run's schema is sha256 {held}, the checkpointed "
                              f"run's sha256 {document['schema-hash']}")
        changed.remove("schema")
    if changed:
        details = ", ".join(f"{key} = {before.get(key)!r} -> {now[key]!r}" for key in changed)
        raise ConfigError(
            f"{_KEY}: the run config differs from the checkpointed "
            f"run's in {details}; only {', '.join(OPERATIONAL_KEYS)} may change"
        )
    arrays = _read_arrays(path, document)
    try:
        return make_strategy(config).restore(document.get("strategy"), arrays)
    except StateError as err:
        raise _unreadable(path, str(err)) from None


def _locate(resume_from: str | Path) -> Path:
    """The checkpoint's JSON file (``resume_from`` or the one in that directory)."""
    path = Path(resume_from).expanduser()
    if path.is_dir():
        if not (path / CHECKPOINT_FILE).exists() and (path / FORMAT_1_FILE).exists():
            raise _other_format(path / FORMAT_1_FILE, 1)
        path = path / CHECKPOINT_FILE
    return path


def _read_document(path: Path) -> dict:
    try:
        raw = path.read_bytes()  # bytes only: nothing in them is run
    except FileNotFoundError:
        raise ConfigError(f"{_KEY}: no checkpoint at {path}") from None
    except OSError as err:
        raise _unreadable(path, str(err)) from None
    # format 1: its file name, or its object stream (protocol 2 and later start with 0x80)
    if path.suffix == Path(FORMAT_1_FILE).suffix or raw[:1] == b"\x80":
        raise _other_format(path, 1)
    try:
        document = json.loads(raw.decode("utf-8"))
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _unreadable(path, f"not JSON: {err}") from None
    if not isinstance(document, dict) or "format-version" not in document:
        raise _unreadable(path, "no format-version")
    if document["format-version"] != FORMAT_VERSION:
        raise _other_format(path, document["format-version"])
    return document


def _read_arrays(path: Path, document: dict) -> dict[str, np.ndarray]:
    """The checkpoint's arrays, from the file its JSON names (beside it), checked
    against the SHA-256 the JSON holds; numeric arrays only (np.load refuses the rest
    by default)."""
    name = document.get("arrays-file")
    if not isinstance(name, str) or Path(name).name != name or not name.endswith(".npz"):
        raise _unreadable(path, f"bad arrays-file {name!r}")
    try:
        raw = (path.parent / name).read_bytes()
    except OSError as err:
        raise _unreadable(path, f"its arrays: {err}") from None
    if hashlib.sha256(raw).hexdigest() != document.get("arrays-sha256"):
        raise _unreadable(path, f"{name} is not the arrays file this checkpoint wrote "
                                "(SHA-256 differs)")
    try:
        with np.load(io.BytesIO(raw)) as npz:
            return {key: npz[key] for key in npz.files}
    except (ValueError, OSError, AttributeError, zipfile.BadZipFile) as err:
        raise _unreadable(path, f"{name}: {err}") from None


def _arrays_file_of(path: Path) -> str | None:
    """The arrays file named by the checkpoint at ``path`` (None: none readable)."""
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("arrays-file")
    except (OSError, ValueError, AttributeError):
        return None


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _other_format(path: Path, version) -> ConfigError:
    extra = (f" ({FORMAT_1_FILE} of fedcluster before format {FORMAT_VERSION}: it is not read, "
             "since loading it could run code; resume it with the fedcluster that wrote it, or "
             "start the run again)") if version == 1 else ""
    return ConfigError(f"{_KEY}: {path} is a checkpoint of format {version!r}, this "
                       f"fedcluster reads format {FORMAT_VERSION}{extra}")


def _unreadable(path: Path, why: str) -> ConfigError:
    return ConfigError(f"{_KEY}: {path} is not a readable fedcluster checkpoint ({why})")
