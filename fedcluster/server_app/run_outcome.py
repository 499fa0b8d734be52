"""Where a run's outputs go and how the run ends (issue 70).

- Its own directory: ``<output-dir>/<run-name>/``, unless an earlier run's outputs are
  there; then ``<run-name>-2`` (``-3``, ...), said in a warning. A run name reused never
  overwrites a model or a checkpoint; a resumed run writes on in the directory it
  resumes from.
- The sites it lost: a site rejected (at its describe round or on resume) or admitted
  but absent from the final evaluation (it failed or left; a site that stopped at its
  own declared ``max-rounds`` is not lost: it said so at the start). The summary's
  first lines name them.
- ``every-site`` (default true): a run that lost a site FAILS once its outputs are
  written (a person can look at them; a pipeline sees a failed run, ``fedcluster run``
  and ``fedcluster simulate`` a non-zero exit). A study's clustering that silently
  lacks a site's data is the failure nobody sees; a federation that expects sites to
  come and go (devices, a site down for maintenance) says ``every-site=false`` and
  gets the run on the others, as many as ``min-sites`` asks.
"""

from __future__ import annotations

import logging
from pathlib import Path

from flwr.common.logger import log

from fedcluster.strategies import FederationError


def _resumed_directory(resume_from: str) -> Path | None:
    if not resume_from:
        return None
    path = Path(resume_from).expanduser()
    return (path if path.is_dir() else path.parent).resolve()


def run_directory(output_dir: str, name: str, resume_from: str = "") -> Path | None:
    """The directory this run writes to (made here; None: ``output-dir`` is ``""``).

    ``<output_dir>/<name>`` if it is new or empty, or the directory a resumed run
    resumes from; else the first free ``<name>-2``, ``<name>-3``, ... (made at once, so
    that two runs started together with one name get one each)."""
    if not output_dir:
        return None
    base = Path(output_dir)
    candidate = base / name
    if _resumed_directory(resume_from) == candidate.resolve():
        return candidate
    number = 1
    while True:
        try:
            candidate.mkdir(parents=True)
            break
        except FileExistsError:
            if candidate.is_dir() and not any(candidate.iterdir()):
                break
            number += 1
            candidate = base / f"{name}-{number}"
    if number > 1:
        log(logging.WARNING, "run name %r is taken in %s (an earlier run's outputs, kept): "
            "this run writes to %s", name, base, candidate)
    return candidate


def lost_sites(metrics: dict) -> dict[str, str]:
    """The sites a run lost, each with why: rejected, or admitted and absent from the
    final evaluation (its last failure named), in site order as the metrics keep them."""
    lost = {key: f"rejected: {reason}" for key, reason in metrics.get("rejected-sites", {}).items()}
    answered = metrics.get("per-site") or {}
    at_limit = metrics.get("sites-at-max-rounds") or {}
    if answered:
        for key, events in (metrics.get("site-failures") or {}).items():
            if key not in answered and key not in at_limit and key not in lost:
                last = f" (last failure: {events[-1]})" if events else ""
                lost[key] = f"not in the final evaluation{last}"
    return lost


def lost_lines(metrics: dict) -> list[str]:
    """The summary's first lines when the run lost a site (none when it did not)."""
    lost = lost_sites(metrics)
    if not lost:
        return []
    total = int(metrics.get("n-sites", 0)) + len(metrics.get("rejected-sites", {}))
    lines = [f"  WARNING: this run lost {len(lost)} of {total} site(s); its figures are those "
             "of the others:"]
    lines += [f"    site {key}: {why}" for key, why in lost.items()]
    return lines


def check_every_site(every_site: bool, metrics: dict, directory: Path | None) -> None:
    """Fail the run (FederationError) if it lost a site and ``every-site`` is true."""
    lost = lost_sites(metrics)
    if not every_site or not lost:
        return
    where = f"its outputs are in {directory}" if directory is not None else "no outputs written"
    raise FederationError(
        f"the run lost {len(lost)} site(s) ("
        + "; ".join(f"site {key}: {why}" for key, why in lost.items())
        + f"), and run config every-site is true: {where}; fix the site(s) and run again, "
        "or set every-site=false to accept a run without them")
