"""The scipy.sparse reference as a backend (``spdnn infer --backend reference``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from spdnn_mpi.backends.base import Backend, BatchResult
from spdnn_mpi.compression import RowGroups
from spdnn_mpi.model import Layer, SparseRows


class ReferenceBackend(Backend):
    """Plain scipy.sparse, one product per layer: what every fast path is tested against."""

    name = "reference"
    tile_rows = 1

    def __init__(self) -> None:
        self._layers: list = []

    def load_network(self, layers: Sequence[Layer], progress=None) -> None:
        self._layers = [(lay.to_scipy_t(), lay.bias_vector(), lay) for lay in layers]

    def load_features(self, rows: SparseRows, drop_empty: bool) -> None:
        self._pos = np.arange(rows.n_rows, dtype=np.int64)
        self._y = rows.to_dense()
        if drop_empty:
            keep = np.diff(rows.indptr) > 0
            self._pos, self._y = self._pos[keep], self._y[keep]
        self._live: list[int] = []

    def run_layer(self, k: int, drop_dead: bool) -> None:
        wt, bias, layer = self._layers[k]
        z = np.asarray(wt @ self._y.T, dtype=np.float32).T + bias[None, :]
        self._y = np.ascontiguousarray(layer.activate(z))
        alive = self._y.any(axis=1)
        self._live.append(int(alive.sum()))
        if drop_dead:
            self._pos, self._y = self._pos[alive], self._y[alive]

    def merge_duplicate_rows(self) -> RowGroups:
        """Plain and exact: ``np.unique`` over the rows' bit patterns, no hashing."""
        n = len(self._pos)
        if n == 0:
            return RowGroups(0, self._pos, self._pos[:0], self._pos[:0])
        _, first, inverse = np.unique(self._y.view(np.uint32), axis=0, return_index=True,
                                      return_inverse=True)
        head = first[inverse.ravel()]
        members = np.flatnonzero(head != np.arange(n))
        keep = np.sort(first)
        groups = RowGroups(n, self._pos[keep], self._pos[members], self._pos[head[members]])
        self._pos, self._y = self._pos[keep], self._y[keep]
        return groups

    def live_count(self) -> int:
        return self._live[-1] if self._live else len(self._pos)

    def finish(self, want_features: bool,
               meanwhile: Callable[[], None] | None = None) -> BatchResult:
        if meanwhile is not None:
            meanwhile()
        alive = self._y.any(axis=1)
        return BatchResult(
            self._pos[alive], self._live, None, self._y[alive] if want_features else None
        )

    def release_buffers(self) -> None:
        """Drop the current features."""
        self._pos = np.zeros(0, dtype=np.int64)
        self._y = np.zeros((0, 0), dtype=np.float32)

    def describe(self) -> dict:
        return {"backend": "reference", "library": "scipy.sparse"}
