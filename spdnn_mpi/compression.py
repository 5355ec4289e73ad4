"""Exact activation compression: compute each distinct live row once.

Rows bit-identical after a layer stay so through every later layer, so the later
layers run on one representative per group and the results are bit for bit those
of the uncompressed run. Here: the cadence of the checks and the bookkeeping that
maps the representatives' results back onto every image; a backend finds the
groups itself (``Backend.merge_duplicate_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: --compress choices of ``spdnn infer`` (``spdnn bench`` adds ``both``).
COMPRESS_MODES = ("auto", "off")

#: Layers (1-based counts done) after which a check may run: often early, where rows
#: collapse (1024 network: 9 distinct of 2868 rows after layer 20), then every
#: CHECK_STRIDE. Data-independent, so queued work is cut at the same layers every run.
EARLY_CHECKPOINTS = (1, 2, 4, 8, 12, 16, 20, 24, 28, 32)
CHECK_STRIDE = 32
#: A check that removes less than this fraction of the rows doubles the gap to the
#: next (rows that never collapse pay for a logarithmic number of checks).
MIN_GAIN = 0.05
#: Largest gap between checks, in layers.
MAX_GAP = 512


@dataclass
class RowGroups:
    """What a backend reports after merging the identical rows it holds: row
    ``members[i]`` (a position in the batch) went into ``owners[i]``; ``kept``: the
    positions held after the merge, sorted."""

    rows_before: int
    kept: np.ndarray
    members: np.ndarray
    owners: np.ndarray

    @property
    def representatives(self) -> int:
        return len(self.kept)


@dataclass
class CompressionEvent:
    """One check after ``layer`` layers: ``rows`` held rows became ``representatives``."""

    layer: int
    rows: int
    representatives: int
    images: int  # images the representatives stand for


def is_checkpoint(layers_done: int) -> bool:
    """Whether a check may run after ``layers_done`` layers (data-independent)."""
    return layers_done in EARLY_CHECKPOINTS or (
        layers_done > EARLY_CHECKPOINTS[-1] and layers_done % CHECK_STRIDE == 0
    )


class Compressor:
    """Cadence and bookkeeping of compression for one batch of ``n_rows`` rows; the
    checks stop once the representatives fit in ``unit_rows`` (a backend's tile)."""

    def __init__(self, n_rows: int, unit_rows: int = 1) -> None:
        self.unit_rows = unit_rows
        self.owner = np.arange(n_rows, dtype=np.int64)  # row -> the row it was merged into
        self.weight = np.ones(n_rows, dtype=np.int64)  # representative -> images it stands for
        self.events: list[CompressionEvent] = []
        self._gap = 1
        self._next = 1
        self._done = False

    @property
    def done(self) -> bool:
        """No check will come: the representatives fit in one unit."""
        return self._done

    def due(self, layers_done: int) -> bool:
        """Whether a check may run now (asked only at checkpoints)."""
        return not self._done and layers_done >= self._next

    def record(self, layers_done: int, groups: RowGroups) -> None:
        """Fold a backend's merge into the map and choose when to look next."""
        members = np.asarray(groups.members, dtype=np.int64)
        owners = np.asarray(groups.owners, dtype=np.int64)
        if len(members):
            np.add.at(self.weight, owners, self.weight[members])
            self.owner[members] = owners
        kept = np.asarray(groups.kept, dtype=np.int64)
        self.events.append(CompressionEvent(layers_done, int(groups.rows_before), len(kept),
                                            int(self.weight[kept].sum())))
        held = groups.rows_before
        gain = 1.0 - len(kept) / held if held else 0.0
        if len(kept) <= self.unit_rows:
            self._done = True
        if gain < MIN_GAIN:
            self._gap = min(MAX_GAP, self._gap * 2)
        self._next = layers_done + self._gap

    def roots(self) -> np.ndarray:
        """For every row of the batch, the representative whose results are its own."""
        root = self.owner
        while True:
            nxt = root[root]
            if np.array_equal(nxt, root):
                return root
            root = nxt

    def expand(self, alive: np.ndarray, features: np.ndarray | None
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """Alive representatives (sorted positions, their features) -> every alive row."""
        if not self.events:
            return alive, features
        alive = np.asarray(alive, dtype=np.int64)
        roots = self.roots()
        rows = np.flatnonzero(np.isin(roots, alive))
        if features is not None:
            features = features[np.searchsorted(alive, roots[rows])]
        return rows, features

    def summary(self) -> list[dict]:
        """The checks that ran, for the report."""
        return [vars(e).copy() for e in self.events]
