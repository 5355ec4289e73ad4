"""Exact activation compression: compute each distinct live row once.

Two rows that are bit-identical after a layer stay bit-identical through
every later layer (each layer is a deterministic function of the row alone),
so a backend may keep one representative per group of identical rows and
run the later layers on the representatives only. The categories and final
features are then bit for bit those of the uncompressed run: every member of
a group is alive exactly when its representative is, with its features.

This module holds what is backend-independent: the cadence (after which
layers the engine asks the backend to look for duplicates) and the
bookkeeping that maps the representatives' results back onto every image.
A backend finds the groups itself, on its own device (see
``backends.base.Backend.merge_duplicate_rows``), by a hash per row and then an exact
comparison inside each hash group, never trusting a hash alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: --compress choices of ``spdnn infer`` (``spdnn bench`` adds ``both``).
COMPRESS_MODES = ("auto", "off")

#: Layers (1-based counts done) after which a check may run: every few layers
#: early, where rows die and then collapse (measured on the real 1024
#: network: 39896 distinct of 59940 after layer 1, 9 of 2868 after layer 20,
#: one from layer 30), then every CHECK_STRIDE layers. The set does not depend
#: on the data, so a backend that cuts queued work at these layers (CUDA
#: graphs) cuts it at the same places in every run.
EARLY_CHECKPOINTS = (1, 2, 4, 8, 12, 16, 20, 24, 28, 32)
CHECK_STRIDE = 32
#: Where a check costs much against a layer (the CUDA backend: a sort and
#: two device-host copies), it runs only once the live count falls by less
#: than this fraction per layer: while rows still die fast, dropping them does
#: the work, and a check over tens of thousands of rows that die a few layers
#: later does not pay (measured on an H200: checks after layers 1-8 made those
#: layers 3.5x slower). See ``fall_rule``.
MAX_FALL_PER_LAYER = 0.02
#: Where the held rows are many values (rows x width at least BIG_HELD), each
#: layer costs so much more than a check's fixed overhead that a check is
#: worth it while rows still die at up to MAX_FALL_BIG per layer (measured:
#: at 65536 x 1920 the first merge came 4 layers late, at 1.6 ms a layer).
BIG_HELD = 1 << 25
MAX_FALL_BIG = 0.10


def fall_rule(fall: float | None, held_values: int) -> bool:
    """Whether a check pays on a backend where checks are dear (``check_pays``).

    ``fall``: the live count's fall per layer since the last sample (None: no
    sample yet); ``held_values``: rows x width held now.
    """
    if fall is None:
        return False
    return fall < (MAX_FALL_BIG if held_values >= BIG_HELD else MAX_FALL_PER_LAYER)


#: A check that removes less than this fraction of the rows doubles the gap
#: to the next check, so networks whose rows never collapse pay for a
#: logarithmic number of checks.
MIN_GAIN = 0.05
#: Largest gap between checks, in layers.
MAX_GAP = 512


@dataclass
class RowGroups:
    """What a backend reports after merging the identical rows it holds.

    ``members[i]`` (a 0-based row position in the batch) was merged into the
    representative at position ``owners[i]``; ``kept`` lists the positions of
    every row held after the merge (the representatives, sorted).
    """

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
    """Cadence and bookkeeping of compression for one batch of ``n_rows`` rows.

    ``unit_rows``: rows the backend computes as one unit (a tile); once the
    representatives fit in one unit, merging more saves nothing and the
    checks stop.
    """

    def __init__(self, n_rows: int, unit_rows: int = 1) -> None:
        self.unit_rows = unit_rows
        self.owner = np.arange(n_rows, dtype=np.int64)  # row -> the row it was merged into
        self.weight = np.ones(n_rows, dtype=np.int64)  # representative -> images it stands for
        self.events: list[CompressionEvent] = []
        self._gap = 1
        self._next = 1
        self._done = False
        self._sample: tuple[int, int] | None = None  # (layers done, live rows) last seen

    def due(self, layers_done: int) -> bool:
        """Whether a check may run now (asked only at checkpoints)."""
        return not self._done and layers_done >= self._next

    def wants_check(self, layers_done: int, live: int, width: int = 1,
                    pays: Callable[[float | None, int], bool] = fall_rule) -> bool:
        """Given the live rows now (``width`` values each), whether to check
        (else: ask at the next checkpoint). ``pays(fall, held_values)`` is the
        backend's rule (``Backend.check_pays``): ``fall`` is the live count's
        fall per layer since the last sample, None before the first.
        """
        prev, self._sample = self._sample, (layers_done, live)
        if live == 0:
            return False
        fall = None
        if prev is not None and prev[1]:
            fall = 1.0 - (live / prev[1]) ** (1.0 / max(1, layers_done - prev[0]))
        return pays(fall, live * width)

    def record(self, layers_done: int, groups: RowGroups) -> None:
        """Fold a backend's merge into the map and choose when to look next."""
        members = np.asarray(groups.members, dtype=np.int64)
        owners = np.asarray(groups.owners, dtype=np.int64)
        if len(members):
            # members are representatives until now: their groups join the owner's
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
        self._sample = (layers_done, len(kept))  # merging is no dying

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
