"""A kept group table's files: ``<cache-dir>/groups/<entry key>.*`` beside the data cache.

An entry is one version's table at one p_site: per group its count, per feature the sums,
the squared deviations (m2) and, where a cell is missing, the present cells; the label
counts; each row's group (-1: waiting) and each row's content hash; and a JSON sidecar
written last (its digest, waiting rows, and its place in the site's answered history:
the table's number in the store and its lineage, ``release/record/``). A reader
maps the arrays; a writer writes each column chunk by chunk (``group_stats.write_column``)
and hashes it on the way, so the digest costs no copy of the table.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from fedcluster.client_app.data import group_stats
from fedcluster.client_app.data.site_data import SiteData, cache_sibling, write_atomic
from fedcluster.client_app.site_groups import GroupLabels

__all__ = ["GROUPS_FORMAT", "entry_key", "lineage_path", "read_arrays", "table_digest",
           "write_entry"]

# v2: groups ordered by a hash of their statistics (v1: by their means), each sum taken
# in row order (group_stats.py): a v1 entry is grouped again. v3: the m2 column is what
# the site may release (release/spreads.py: spread units, the dominance rule), not each
# group's own: a v2 entry is not read (its kept groups are computed again from their rows,
# the rule applied).
GROUPS_FORMAT = "fedcluster-site-groups-v3"


def digest_start(min_size: int):
    return hashlib.sha256(f"{GROUPS_FORMAT}\0{min_size}\0".encode())


def digest_labels(digest, labels: GroupLabels | None) -> str:
    if labels is not None:
        for part in (labels.group, labels.code, labels.count):
            digest.update(np.ascontiguousarray(part))
        digest.update(json.dumps(labels.names).encode())
    return digest.hexdigest()


def table_digest(counts, sums, m2, present, labels: GroupLabels | None, min_size: int) -> str:
    """sha256 of a group table: what the disclosure ledger names each reply by (each
    array's bytes, hashed in place: no copy of a large table)."""
    digest = digest_start(min_size)
    for part in (counts, sums, m2, present):
        if part is not None:
            digest.update(np.ascontiguousarray(part))
    return digest_labels(digest, labels)


# Arrays of an entry: name -> whether every entry has it.
_PARTS = {"counts": True, "sums": True, "m2": True, "present": False, "labels": False,
          "row-groups": True, "row-hashes": True}


def entry_key(site: SiteData, min_size: int) -> str:
    return hashlib.sha256(f"{GROUPS_FORMAT}\0{site.version}\0{min_size}".encode()).hexdigest()


def lineage_path(directory: Path, site: SiteData, min_size: int) -> Path:
    """Where an earlier release named a file's latest table (imported into the store)."""
    key = hashlib.sha256(f"{GROUPS_FORMAT}\0{site.lineage}\0{min_size}".encode()).hexdigest()
    return directory / f"lineage-{key[:40]}.json"


def write_entry(base: Path, table: group_stats.Table, min_size: int, group_of_row: np.ndarray,
                hashes: np.ndarray, version: dict) -> None:
    """The entry's arrays, then its sidecar (last: with it, the entry is complete). A
    column is dropped from ``table`` once written, so its memory goes with it."""
    digest, has = digest_start(min_size), []
    for name in ("counts", "sums", "m2", "present"):
        pieces = table.columns.pop(name)
        if pieces is not None:
            write_atomic(cache_sibling(base, f".{name}.npy"), lambda f, pieces=pieces:
                         group_stats.write_column(f, name, pieces, table.width, digest))
            has.append(name)
        del pieces
    labels = table.labels
    parts = {"row-groups": group_of_row, "row-hashes": hashes,
             "labels": None if labels is None else np.stack([labels.group, labels.code, labels.count], 1)}
    for name, array in parts.items():
        if array is not None:
            write_atomic(cache_sibling(base, f".{name}.npy"),
                         lambda f, a=np.ascontiguousarray(array): np.save(f, a))
            has.append(name)
    meta = {"format": GROUPS_FORMAT, "min-size": min_size, "digest": digest_labels(digest, labels),
            "waiting": table.waiting, "has": has,
            "label-names": None if labels is None else list(labels.names), **version}
    write_atomic(cache_sibling(base, ".json"), lambda f: f.write(json.dumps(meta).encode()))


def read_arrays(base: Path) -> tuple[dict, dict] | None:
    """An entry's sidecar and its arrays, memory-mapped (None: missing or damaged)."""
    try:  # the sidecar is written last: with it, the entry is complete
        meta = json.loads(cache_sibling(base, ".json").read_text())
        if meta.get("format") != GROUPS_FORMAT:
            return None
        parts = {name: np.load(cache_sibling(base, f".{name}.npy"), mmap_mode="r")
                 for name in meta["has"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(needed and name not in parts for name, needed in _PARTS.items()):
        return None
    return meta, parts
