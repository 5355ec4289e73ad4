"""The plain reference every fast path is tested against (scipy.sparse, no tricks).

Its one economy is dropping all-zero rows where that is exact (every remaining
layer maps a zero row to zero). A row is alive when any of its values is nonzero.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.readout import classes_of_rows

LayerProgress = Callable[..., None]  # (layers done[, detail]), e.g. a progress.Progress


def droppable_after(network: Network) -> list[bool]:
    """Whether dead rows stay dead: ``out[0]`` for dead input rows, ``out[k + 1]``
    after 0-based layer ``k`` (every later layer maps zero to zero)."""
    flags = [False] * (network.n_layers + 1)
    ok = True
    for k in range(network.n_layers, -1, -1):
        flags[k] = ok
        if k > 0:
            ok = ok and network.layers[k - 1].maps_zero_to_zero
    return flags


def forward_dense(network: Network, features: np.ndarray) -> np.ndarray:
    """All layers applied to every row of a dense float32 matrix, no dropping."""
    y = np.asarray(features, dtype=np.float32)
    for layer in network.layers:
        z = np.asarray(layer.to_scipy_t() @ y.T, dtype=np.float32).T
        z = z + layer.bias_vector()[None, :]
        y = layer.activate(z.astype(np.float32, copy=False))
    return y


def reference_infer(network: Network, rows: SparseRows,
                    progress: LayerProgress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(alive global 0-based row ids, their final features) after all layers."""
    ids, yt, _ = _reference_pass(network, rows, (), progress)
    alive = yt.any(axis=0)
    return ids[alive], np.ascontiguousarray(yt[:, alive].T)


def reference_categories_at(network: Network, rows: SparseRows, counts: list[int],
                            progress: LayerProgress | None = None) -> dict[int, np.ndarray]:
    """Categories after each of ``counts`` layers, from one pass (the challenge's
    120- and 480-layer networks are prefixes of the 1920-layer one)."""
    bad = [n for n in counts if not 1 <= n <= network.n_layers]
    if bad:
        raise ValueError(f"layer counts {bad} outside 1..{network.n_layers}")
    deepest = max(counts)
    _, _, out = _reference_pass(network.truncated(deepest), rows, set(counts), progress)
    return out


def reference_memory_bytes(n_rows: int, width: int) -> int:
    """Host memory the reference pass needs beyond its inputs: about three dense
    float32 matrices of ``n_rows`` x ``width`` (measured 12.4 B an entry at 60000 x 1024)."""
    return 3 * 4 * int(n_rows) * int(width)


def _dense_t(rows: SparseRows, positions: np.ndarray) -> np.ndarray:
    """Features of the rows at ``positions`` as a dense width x len(positions) matrix."""
    out = np.zeros((rows.n_cols, len(positions)), dtype=np.float32)
    counts = np.diff(rows.indptr)[positions]
    first = rows.indptr[positions] - rows.indptr[0]  # where each selected row starts
    column = np.repeat(np.arange(len(positions)), counts)
    entry = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
    out[rows.indices[entry].astype(np.int64), column] = rows.row_values()[entry]
    return out


def _reference_pass(network: Network, rows: SparseRows, counts,
                    progress: LayerProgress | None = None):
    """(ids, features transposed) after all layers, and categories after each of ``counts``.
    Transposed (neurons x rows), ``W^T @ Y^T`` needs no transposed copy per layer."""
    out: dict[int, np.ndarray] = {}
    drop = droppable_after(network)
    positions = np.arange(rows.n_rows, dtype=np.int64)
    if drop[0]:
        positions = positions[np.diff(rows.indptr) > 0]
    ids = positions + rows.first_row
    yt = _dense_t(rows, positions)
    for k, layer in enumerate(network.layers):
        z = np.asarray(layer.to_scipy_t() @ yt, dtype=np.float32)
        yt = None  # free the input features before the next matrix is made
        z += layer.bias_vector()[:, None]
        z = layer.activate(z)
        alive = z.any(axis=0)
        if k + 1 in counts:
            out[k + 1] = np.sort(ids[alive]) + 1
        if drop[k + 1] and not alive.all():
            ids, z = ids[alive], z[:, alive]
        yt = z
        if progress is not None:
            progress(k + 1, f"{len(ids)} rows live")
    return ids, yt, out


def reference_categories(network: Network, rows: SparseRows,
                         progress: LayerProgress | None = None) -> np.ndarray:
    """Sorted 1-based ids of the images whose final row has any nonzero."""
    ids, _ = reference_infer(network, rows, progress)
    return np.sort(ids) + 1


def reference_predictions(network: Network, rows: SparseRows) -> np.ndarray:
    """One predicted class per row (0-based, int64): the argmax of its final features,
    ties to the lowest index (ONNX ArgMax); a row dropped as dead gets class 0."""
    ids, yt, _ = _reference_pass(network, rows, ())
    return classes_of_rows(rows.n_rows, ids - rows.first_row, yt.T)

