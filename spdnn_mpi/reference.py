"""The plain reference every fast path is tested against (scipy.sparse, no tricks).

It applies ``Y <- min(act(Y @ W + b), clip)`` (``act`` ReLU or none) to whole
feature matrices. The only economy is dropping rows that are all zero, and
only where that is exact: when every remaining layer maps a zero row to a
zero row (``Layer.maps_zero_to_zero``). A row is alive when any of its values
is nonzero.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.readout import classes_of_rows

LayerProgress = Callable[..., None]  # (layers done[, detail]), e.g. a progress.Progress


def droppable_after(network: Network) -> list[bool]:
    """``out[k]``: rows dead after layer k (k = -1 .. L-1, shifted by one) stay dead.

    ``out[0]`` is for dead input rows, ``out[k + 1]`` for rows dead after
    0-based layer ``k``. True when every later layer maps zero to zero.
    """
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
    """Categories after each of ``counts`` layers, from one pass over the layers.

    The challenge's 120- and 480-layer networks are prefixes of the 1920-layer
    one, so their truth comes from one run instead of three.
    """
    bad = [n for n in counts if not 1 <= n <= network.n_layers]
    if bad:
        raise ValueError(f"layer counts {bad} outside 1..{network.n_layers}")
    deepest = max(counts)
    _, _, out = _reference_pass(network.truncated(deepest), rows, set(counts), progress)
    return out


def reference_memory_bytes(n_rows: int, width: int) -> int:
    """Host memory the reference pass needs beyond its inputs: about three dense
    float32 matrices of ``n_rows`` x ``width`` (features in, features out and
    transient copies; measured 12.4 B per entry at 60000 x 1024)."""
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

    Features are kept transposed (neurons x rows, C order): ``W^T @ Y^T`` then
    reads and writes whole contiguous rows, with no transposed copy per layer,
    and at most two dense matrices are alive at once.
    """
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
        z = layer.activate(z)  # elementwise, in place: neurons x rows is fine
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
    """One predicted class per row (0-based, int64): the argmax of its final features.

    Ties go to the lowest index (``numpy.argmax``, ONNX ArgMax). A row dropped
    as dead (only where every later layer maps zero to zero) has an all-zero
    final row, so its class is that of a zero row: 0.
    """
    ids, yt, _ = _reference_pass(network, rows, ())
    return classes_of_rows(rows.n_rows, ids - rows.first_row, yt.T)

