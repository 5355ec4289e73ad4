"""GPU peers for `spdnn bench`: cuSPARSE (through CuPy) and torch.sparse, CSR of W^T times
dense Y^T with the engine's row dropping; each returns ``(sorted alive 0-based ids,
inference seconds)``, timed as the engine times (inputs already on the device).
"""

from __future__ import annotations

import time

import numpy as np

from spdnn_mpi.bench.peers.device_memory import out_of_memory_is_a_skip
from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.reference import droppable_after


@out_of_memory_is_a_skip("cusparse")
def cusparse_infer(network: Network, rows: SparseRows) -> tuple[np.ndarray, float]:
    """Inference through cupyx.scipy.sparse (cuSPARSE SpMM), dead rows dropped per layer
    by index (CuPy's boolean row mask takes 31 GB at 60000 x 65536)."""
    from spdnn_mpi.backends.cuda.compile import import_cupy

    cp = import_cupy()
    import cupyx.scipy.sparse as cps

    drop = droppable_after(network)
    mats = []
    for layer in network.layers:
        wt = cps.csr_matrix(
            (cp.asarray(layer.weight_values()), cp.asarray(layer.indices.astype(np.int32)),
             cp.asarray(np.asarray(layer.indptr, dtype=np.int32))),
            shape=(layer.n_out, layer.n_in),
        )
        bias = cp.asarray(layer.bias_vector())[None, :]
        clip = None if layer.clip is None else np.float32(layer.clip)
        mats.append((wt, bias, clip, layer.activation == "relu"))
    base = int(rows.indptr[0])
    y = cps.csr_matrix(
        (cp.asarray(rows.row_values()), cp.asarray(rows.indices.astype(np.int32)),
         cp.asarray(np.asarray(rows.indptr, dtype=np.int64) - base).astype(np.int32)),
        shape=(rows.n_rows, rows.n_cols),
    ).toarray()
    ids = cp.arange(rows.n_rows, dtype=np.int64)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    if drop[0]:
        keep = cp.flatnonzero(y.any(axis=1))
        y, ids = y[keep], ids[keep]
    for k, (wt, bias, clip, relu) in enumerate(mats):
        if y.shape[0]:
            z = (wt @ y.T).T  # (rows, n_out); y.T is Fortran-ordered, as SpMM wants
            z = z + bias
        else:
            z = cp.zeros((0, wt.shape[0]), dtype=cp.float32)
        if relu:
            cp.maximum(z, 0, out=z)
        if clip is not None:
            cp.minimum(z, clip, out=z)
        y = cp.ascontiguousarray(z)
        if drop[k + 1]:
            keep = cp.flatnonzero(y.any(axis=1))
            y, ids = y[keep], ids[keep]
    alive = ids[y.any(axis=1)].get() if y.shape[0] else np.zeros(0, np.int64)
    seconds = time.perf_counter() - t0
    mats = y = z = ids = None  # noqa: F841  (free before the next peer)
    cp.get_default_memory_pool().free_all_blocks()  # leave the device to the next peer
    return np.sort(alive) + rows.first_row, seconds


@out_of_memory_is_a_skip("torch")
def torch_sparse_infer(network: Network, rows: SparseRows) -> tuple[np.ndarray, float]:
    """Inference through torch.sparse CSR (cuSPARSE underneath), dead rows dropped per layer."""
    from spdnn_mpi.bench.peers.torch_models import torch_csr_t, torch_device

    torch, dev = torch_device("torch")
    drop = droppable_after(network)
    mats = []
    for layer in network.layers:
        wt = torch_csr_t(torch, layer, dev)
        bias = torch.as_tensor(layer.bias_vector(), device=dev)[None, :]
        mats.append((wt, bias, layer.clip, 0.0 if layer.activation == "relu" else None))
    base = int(rows.indptr[0])
    y = torch.sparse_csr_tensor(
        torch.as_tensor(np.asarray(rows.indptr, dtype=np.int64) - base),
        torch.as_tensor(rows.indices.astype(np.int64)),
        torch.as_tensor(rows.row_values()),
        size=(rows.n_rows, rows.n_cols), device=dev,
    ).to_dense()
    ids = torch.arange(rows.n_rows, device=dev)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    if drop[0]:
        keep = (y != 0).any(dim=1)
        y, ids = y[keep], ids[keep]
    for k, (wt, bias, clip, floor) in enumerate(mats):
        if y.shape[0]:
            z = (wt @ y.T).T + bias
        else:
            z = torch.zeros((0, wt.shape[0]), device=dev)
        if floor is not None or clip is not None:
            z.clamp_(min=floor, max=clip)
        y = z.contiguous()
        if drop[k + 1]:
            keep = (y != 0).any(dim=1)
            y, ids = y[keep], ids[keep]
    alive = ids[(y != 0).any(dim=1)].cpu().numpy() if y.shape[0] else np.zeros(0, np.int64)
    seconds = time.perf_counter() - t0
    mats = y = z = ids = None  # noqa: F841  (free before the next peer)
    torch.cuda.empty_cache()  # leave the device to the next peer
    return np.sort(alive.astype(np.int64)) + rows.first_row, seconds
