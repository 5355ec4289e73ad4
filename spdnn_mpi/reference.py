"""The plain reference every fast path is tested against (scipy.sparse, no tricks).

It applies ``Y <- min(act(Y @ W + b), clip)`` (``act`` ReLU or none) to whole
feature matrices. The only economy is dropping rows that are all zero, and
only where that is exact: when every remaining layer maps a zero row to a
zero row (``Layer.maps_zero_to_zero``). A row is alive when any of its values
is nonzero.
"""

from __future__ import annotations

import numpy as np

from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.readout import classes_of_rows


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


def reference_infer(network: Network, rows: SparseRows) -> tuple[np.ndarray, np.ndarray]:
    """(alive global 0-based row ids, their final features) after all layers."""
    ids, y, _ = _reference_pass(network, rows, ())
    alive = y.any(axis=1)
    return ids[alive], y[alive]


def reference_categories_at(network: Network, rows: SparseRows,
                            counts: list[int]) -> dict[int, np.ndarray]:
    """Categories after each of ``counts`` layers, from one pass over the layers.

    The challenge's 120- and 480-layer networks are prefixes of the 1920-layer
    one, so their truth comes from one run instead of three.
    """
    bad = [n for n in counts if not 1 <= n <= network.n_layers]
    if bad:
        raise ValueError(f"layer counts {bad} outside 1..{network.n_layers}")
    deepest = max(counts)
    _, _, out = _reference_pass(network.truncated(deepest), rows, set(counts))
    return out


def _reference_pass(network: Network, rows: SparseRows, counts):
    """(ids, features) after all layers, and categories after each count in ``counts``."""
    out: dict[int, np.ndarray] = {}
    drop = droppable_after(network)
    ids = np.arange(rows.n_rows, dtype=np.int64) + rows.first_row
    y = rows.to_dense()
    if drop[0]:
        keep = np.diff(rows.indptr) > 0
        ids, y = ids[keep], y[keep]
    for k, layer in enumerate(network.layers):
        wt = layer.to_scipy_t()
        z = np.asarray(wt @ y.T, dtype=np.float32).T + layer.bias_vector()[None, :]
        y = np.ascontiguousarray(layer.activate(z), dtype=np.float32)
        if k + 1 in counts:
            out[k + 1] = np.sort(ids[y.any(axis=1)]) + 1
        if drop[k + 1]:
            keep = y.any(axis=1)
            ids, y = ids[keep], y[keep]
    return ids, y, out


def reference_categories(network: Network, rows: SparseRows) -> np.ndarray:
    """Sorted 1-based ids of the images whose final row has any nonzero."""
    ids, _ = reference_infer(network, rows)
    return np.sort(ids) + 1


def reference_predictions(network: Network, rows: SparseRows) -> np.ndarray:
    """One predicted class per row (0-based, int64): the argmax of its final features.

    Ties go to the lowest index (``numpy.argmax``, ONNX ArgMax). A row dropped
    as dead (only where every later layer maps zero to zero) has an all-zero
    final row, so its class is that of a zero row: 0.
    """
    ids, y, _ = _reference_pass(network, rows, ())
    return classes_of_rows(rows.n_rows, ids - rows.first_row, y)

