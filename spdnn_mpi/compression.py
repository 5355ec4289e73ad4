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
    checks stop once the representatives fit in ``unit_rows`` (a backend's tile).

    ``record`` only decides when to look next; the merges are folded into the maps
    (row -> representative, images a representative stands for) by ``fold``, which
    the engine calls while the device runs the batch's last layers: allocating and
    folding the maps of 60000 rows is host work a check would otherwise wait on.
    """

    def __init__(self, n_rows: int, unit_rows: int = 1) -> None:
        self.n_rows = n_rows
        self.unit_rows = unit_rows
        self._owner: np.ndarray | None = None  # row -> the row it was merged into
        self._weight: np.ndarray | None = None  # representative -> images it stands for
        self._recorded: list[tuple[int, RowGroups]] = []  # merges not folded yet
        self._events: list[CompressionEvent] = []
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
        """Note a backend's merge (``fold`` maps it) and choose when to look next."""
        self._recorded.append((layers_done, groups))
        held = groups.rows_before
        kept = len(groups.kept)
        gain = 1.0 - kept / held if held else 0.0
        if kept <= self.unit_rows:
            self._done = True
        if gain < MIN_GAIN:
            self._gap = min(MAX_GAP, self._gap * 2)
        self._next = layers_done + self._gap

    def fold(self) -> None:
        """Fold the merges recorded so far into the maps, in the order they ran."""
        if not self._recorded:
            return
        if self._owner is None:
            self._owner = np.arange(self.n_rows, dtype=np.int64)
            self._weight = np.ones(self.n_rows, dtype=np.int64)
        owner, weight = self._owner, self._weight
        for layers_done, groups in self._recorded:
            members = np.asarray(groups.members, dtype=np.int64)
            owners = np.asarray(groups.owners, dtype=np.int64)
            if len(members):
                np.add.at(weight, owners, weight[members])
                owner[members] = owners
            kept = np.asarray(groups.kept, dtype=np.int64)
            self._events.append(CompressionEvent(layers_done, int(groups.rows_before),
                                                 len(kept), int(weight[kept].sum())))
        self._recorded = []

    @property
    def events(self) -> list[CompressionEvent]:
        """The checks that ran, in order (folding what is recorded)."""
        self.fold()
        return self._events

    def roots(self) -> np.ndarray:
        """For every row of the batch, the representative whose results are its own."""
        self.fold()
        if self._owner is None:
            return np.arange(self.n_rows, dtype=np.int64)
        root = self._owner
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
