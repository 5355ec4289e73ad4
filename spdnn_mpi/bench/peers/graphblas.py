"""CPU peer for the benchmark: SuiteSparse:GraphBLAS through python-graphblas (Y sparse,
so rows that die cost nothing, like our row dropping)."""

from __future__ import annotations

import time

import numpy as np

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.reference import LayerProgress

#: Host bytes the peer holds per image x neuron at its peak (measured at 60000 x 1024).
GRAPHBLAS_BYTES_PER_ENTRY = 16


def graphblas_memory_check(network: Network, rows: SparseRows) -> None:
    """Refuse before building anything when the peer cannot fit in host memory."""
    from spdnn_mpi.util.memory import require

    width = max(max(layer.n_in, layer.n_out) for layer in network.layers)
    require(GRAPHBLAS_BYTES_PER_ENTRY * rows.n_rows * width,
            f"peer graphblas ({rows.n_rows} images x {width} neurons)",
            "leave --peer graphblas out, or bench fewer --images")


def graphblas_infer(network: Network, rows: SparseRows, threads: int | None = None,
                    progress: LayerProgress | None = None) -> tuple[np.ndarray, float]:
    """(sorted alive 0-based ids, inference seconds) computed as the official GraphBLAS
    reference does; needs scalar biases <= 0. Written in place (``<<``) into two matrices:
    a ``.new()`` a step grew the memory with every layer (12.2 GB at 1024 x 120).
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
                           rows.row_values().astype(np.float32, copy=False),
                           nrows=rows.n_rows, ncols=rows.n_cols)
    width = max((layer.n_out for layer in network.layers), default=rows.n_cols)
    z = gb.Matrix(gb.dtypes.FP32, nrows=rows.n_rows, ncols=width)
    t0 = time.perf_counter()
    for k, (layer, w) in enumerate(zip(network.layers, weights)):
        if z.ncols != layer.n_out:
            z.resize(rows.n_rows, layer.n_out)
        z << y.mxm(w, semiring.plus_times)
        z << z.apply(binary.plus, right=np.float32(layer.bias))
        z << select.valuegt(z, 0)
        if layer.clip is not None:
            z << z.apply(binary.min, right=np.float32(layer.clip))
        y, z = z, y
        if progress is not None:
            progress(k + 1)
    alive_rows = np.unique(y.to_coo(values=False)[0]) if y.nvals else np.zeros(0, np.int64)
    seconds = time.perf_counter() - t0
    return np.asarray(alive_rows, dtype=np.int64) + rows.first_row, seconds
