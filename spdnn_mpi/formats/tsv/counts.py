"""Counting the entries per image id while inputs are read, and the stray-id rule.

``read_images`` of a file not sorted by image counts the entries of each
image in a first pass; a stray id (10^9 in a file of 60000 images) must not
make that count array 10^9 long before anything has looked at it, so ids far
beyond the lines read are kept aside, sparse, until the stray-id rule has.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spdnn_mpi.errors import InputFormatError

#: Without --images, the largest image id sets the number of images; it is refused as
#: a likely stray id when that makes more empty images than non-empty ones, and more
#: than this many (one stray id of 10^6 would otherwise make 998,000 empty images).
STRAY_EMPTY_IMAGES = 1000


def check_stray_id(path: Path, top: int, distinct: int, blocks) -> None:
    """Refuse a largest id ``top`` far beyond the ``distinct`` ids (see STRAY_EMPTY_IMAGES)."""
    empty = top - distinct
    if empty <= max(distinct, STRAY_EMPTY_IMAGES):
        return
    line, seen = None, 0
    for a, _, _ in blocks():  # error path only: the line of that id
        hit = np.flatnonzero(a == top - 1)
        if len(hit):
            line = seen + int(hit[0]) + 1
            break
        seen += len(a)
    raise InputFormatError(
        path, line,
        f"image id {top} is far beyond the {distinct} distinct image ids of the file "
        f"({empty} of the images 1..{top} would be empty): a stray id? If the file really "
        f"holds {top} images, say so with --images {top}",
    )


class RowCounts:
    """Entries per image id, dense up to a cap that grows with the lines read.

    Ids far beyond the cap (a stray 10^9) are kept aside sparsely, so they cost
    no memory before :func:`check_stray_id` has looked at them.
    """

    def __init__(self, bounded: bool):
        self.dense = np.zeros(0, dtype=np.int64)
        self.far: list[tuple[np.ndarray, np.ndarray]] = []
        self.lines = 0
        self.bounded = bounded  # ids were checked against a given number of images

    def add(self, rows: np.ndarray, lengths: np.ndarray | None = None) -> None:
        if not len(rows):
            return
        self.lines += len(rows) if lengths is None else int(lengths.sum())
        cap = max(4 * self.lines, 1 << 22)
        if not self.bounded and int(rows.max()) >= cap:
            far = rows >= cap
            ids, inverse = np.unique(rows[far], return_inverse=True)
            weights = None if lengths is None else lengths[far]
            self.far.append((ids, np.bincount(inverse, weights=weights).astype(np.int64)))
            rows = rows[~far]
            lengths = None if lengths is None else lengths[~far]
        self.dense = _add_counts(self.dense, rows, lengths)

    def top_and_distinct(self) -> tuple[int, int]:
        """(largest id + 1, number of distinct ids)."""
        nonzero = np.flatnonzero(self.dense)
        top = int(nonzero[-1]) + 1 if len(nonzero) else 0
        far = np.unique(np.concatenate([ids for ids, _ in self.far])) if self.far else []
        if len(far):
            top = max(top, int(far[-1]) + 1)
        return top, len(nonzero) + len(far)

    def counts(self) -> np.ndarray:
        """Entries per id as one dense array (the far ids merged in)."""
        for ids, cnt in self.far:
            self.dense = _add_counts(self.dense, ids, cnt)
        self.far = []
        return self.dense


def _add_counts(counts: np.ndarray, rows: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
    """``counts[r] += lengths`` (or 1) for each r in ``rows``, growing ``counts`` as needed."""
    if not len(rows):
        return counts
    top = int(rows.max()) + 1
    if top > len(counts):
        grown = np.zeros(max(top, 2 * len(counts)), dtype=np.int64)
        grown[: len(counts)] = counts
        counts = grown
    counts[:top] += np.bincount(rows, weights=lengths, minlength=top).astype(np.int64)
    return counts
