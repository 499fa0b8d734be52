"""What makes a row the same row in two versions of a site's data.

Without an id column a row IS its content: the bits of its cells and its label
(:func:`content_keys`), so a row whose cell was corrected is another row (the old one gone,
a new one come). With an id column (node config ``id-column``, or a schema column of type
``id``) a row is its id and its content (:func:`instance_keys`): a corrected row is a new
version of the same row, which is what the versions audit protects (no one-row change
in the span: ``release/audit/span.py``). Keys are two independent 64-bit hashes (128 bits): two
different rows share a key with probability about n^2 / 2^128.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedcluster.client_app.release.record.instances import mix
from fedcluster.client_app.mapped_pages import release_pages
from fedcluster.common.kernels import compiled_kernels

__all__ = ["CHUNK_ROWS", "COMPILED_FROM_ROWS", "content_keys", "id_keys", "instance_keys"]

#: Rows per chunk of a pass over the rows: bounds the temporaries to a few CHUNK_ROWS x d values.
CHUNK_ROWS = 1 << 14
#: From this many rows the content hashes are compiled (``kernels._compiled.content_hashes``,
#: the same bits: a 1M x 64 site's 1 s in NumPy); a smaller site's fresh process need not
#: load Numba for them.
COMPILED_FROM_ROWS = 1 << 16


def _text_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def content_keys(X: np.ndarray, label_codes: np.ndarray | None = None,
                 label_names: tuple[str, ...] | None = None) -> np.ndarray:
    """(n, 2) uint64: two independent 64-bit hashes of each row's cells (their bits) and
    label (its text, ``label_names[label_codes[i]]``): a row's content, wherever it sits
    in the file. A memory-mapped ``X`` is read in file order, its pages dropped after
    each chunk."""
    n, d = X.shape
    out = np.empty((n, 2), dtype=np.uint64)
    label_bits = None
    if label_codes is not None:
        text = [_text_hash(name) for name in label_names]
        label_bits = np.asarray(text, dtype=np.uint64)[label_codes]
    compiled = n >= COMPILED_FROM_ROWS and d > 0
    for start in range(0, n, CHUNK_ROWS):
        stop = min(n, start + CHUNK_ROWS)
        if compiled:  # (the same bits: kernels._compiled.content_hashes)
            rows = np.ascontiguousarray(X[start:stop], dtype=np.float64)
            release_pages(X)
            compiled_kernels().content_hashes(rows.view(np.uint64), out[start:stop])
            a, b = out[start:stop, 0], out[start:stop, 1]
        else:  # features as contiguous columns: each step below reads one feature
            bits = np.ascontiguousarray(np.asarray(X[start:stop], dtype=np.float64).T)
            bits = bits.view(np.uint64)
            release_pages(X)
            a = np.full(stop - start, 0x9E3779B97F4A7C15, dtype=np.uint64)
            b = np.full(stop - start, 0xD1B54A32D192ED03, dtype=np.uint64)
            for j in range(d):
                a = mix(a ^ bits[j])
                b = mix(b + mix(bits[j] ^ np.uint64(j + 1)))
        if label_bits is not None:
            a = mix(a ^ label_bits[start:stop])
            b = mix(b + label_bits[start:stop])
        out[start:stop, 0], out[start:stop, 1] = a, b
    return out


def id_keys(cells) -> np.ndarray:
    """(n, 2) uint64: the hash of each id cell's text (surrounding spaces stripped)."""
    out = np.empty((len(cells), 2), dtype=np.uint64)
    for i, cell in enumerate(cells):
        digest = hashlib.sha256(str(cell).strip().encode()).digest()
        out[i, 0] = int.from_bytes(digest[:8], "little")
        out[i, 1] = int.from_bytes(digest[8:16], "little")
    return out


def instance_keys(content: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    """The key a row is matched by across versions: its content, or with an id column its
    id and its content together (a corrected row: the same id, another key)."""
    if ids is None:
        return content
    out = np.empty_like(content)
    out[:, 0] = mix(ids[:, 0] ^ mix(content[:, 0]))
    out[:, 1] = mix(ids[:, 1] + mix(content[:, 1] ^ np.uint64(0x5851F42D4C957F2D)))
    return out
