"""CPU peer for the benchmark: SuiteSparse:GraphBLAS through python-graphblas.

The established CPU reference for the challenge: Y is a sparse matrix, so
rows that die hold no entries and cost nothing, which is the same row
dropping our engine does.
"""

from __future__ import annotations

import time

import numpy as np

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Network, SparseRows


def graphblas_infer(network: Network, rows: SparseRows,
                    threads: int | None = None) -> tuple[np.ndarray, float]:
    """(sorted alive 0-based ids, inference seconds) computed with GraphBLAS.

    Follows the official GraphBLAS reference: Z = Y (+.*) W; bias added to the
    entries of Z; keep entries > 0; min with the clip. Needs scalar biases
    <= 0 (then this equals the plain formula).
    """
    try:
        import graphblas as gb
        from graphblas import binary, select, semiring
    except ImportError as exc:
        raise SpdnnError(f"peer graphblas needs python-graphblas ({exc.name} missing); "
                         "`pip install python-graphblas`") from None
    for k, layer in enumerate(network.layers):
        if layer.activation != "relu":
            raise SpdnnError(f"peer graphblas: layer {k + 1} has no ReLU; only "
                             "challenge-style ReLU layers are supported")
        if not layer.bias_is_scalar or layer.bias > 0:
            raise SpdnnError(f"peer graphblas: layer {k + 1} has a vector or positive bias; "
                             "only challenge-style scalar biases <= 0 are supported")
    if threads is not None:
        gb.ss.config["nthreads"] = threads
    weights = [
        gb.Matrix.from_csc(layer.indptr, layer.indices.astype(np.int64),
                           layer.weight_values(), nrows=layer.n_in, ncols=layer.n_out)
        for layer in network.layers
    ]
    y = gb.Matrix.from_csr(rows.indptr - rows.indptr[0], rows.indices.astype(np.int64),
                           rows.row_values(), nrows=rows.n_rows, ncols=rows.n_cols)
    t0 = time.perf_counter()
    for layer, w in zip(network.layers, weights):
        z = y.mxm(w, semiring.plus_times).new()
        z = z.apply(binary.plus, right=np.float32(layer.bias)).new()
        z = select.valuegt(z, 0).new()
        if layer.clip is not None:
            z = z.apply(binary.min, right=np.float32(layer.clip)).new()
        y = z
    alive_rows = np.unique(y.to_coo(values=False)[0]) if y.nvals else np.zeros(0, np.int64)
    seconds = time.perf_counter() - t0
    return np.asarray(alive_rows, dtype=np.int64) + rows.first_row, seconds
