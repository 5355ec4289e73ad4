"""GPU peers for imported models: PyTorch dense (one cuBLAS GEMM a layer, zeros included)
and torch.sparse CSR (cuSPARSE SpMM), timed as the engine times. A missing PyTorch or
device, or running out of memory, is a ``SpdnnError`` (a skip)."""

from __future__ import annotations

import numpy as np

from spdnn_mpi.bench.peers import timed_runs
from spdnn_mpi.bench.peers.device_memory import out_of_memory_is_a_skip
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Network, SparseRows


def torch_device(peer: str):
    """(torch, its current CUDA device), or a clear SpdnnError naming ``peer``."""
    try:
        import torch
    except ImportError as exc:
        raise SpdnnError(f"peer {peer} needs PyTorch ({exc.name} missing)") from None
    if not torch.cuda.is_available():
        raise SpdnnError(f"peer {peer}: PyTorch sees no CUDA device")
    return torch, torch.device("cuda", torch.cuda.current_device())


def torch_csr_t(torch, layer, dev):
    """W^T of ``layer`` as a torch.sparse CSR tensor (n_out x n_in) on ``dev``."""
    return torch.sparse_csr_tensor(
        torch.as_tensor(np.asarray(layer.indptr, dtype=np.int64)),
        torch.as_tensor(layer.indices.astype(np.int64)),
        torch.as_tensor(layer.weight_values()),
        size=(layer.n_out, layer.n_in), device=dev)


def _timed(torch, dev, fn, repeat: int) -> tuple[np.ndarray, float, list[float]]:
    """``timed_runs`` of ``fn``, which ends with a copy to the host (so synchronises)."""
    return timed_runs(fn, repeat, lambda: torch.cuda.synchronize(dev))


def _epilogue(torch, z, layer):
    if layer.activation == "relu":
        z = torch.relu_(z)
    if layer.clip is not None:
        z = z.clamp_(max=layer.clip)
    return z


@out_of_memory_is_a_skip("torch-dense")
def torch_dense_infer(network: Network, rows: SparseRows, *, batch: int | None = None,
                      repeat: int = 3) -> tuple[np.ndarray, float, list[float]]:
    """(final outputs, median seconds, all runs' seconds) of the dense model in PyTorch."""
    torch, dev = torch_device("torch-dense")
    mats = [(torch.as_tensor(layer.to_scipy_t().toarray().T.copy(), device=dev),
             torch.as_tensor(layer.bias_vector(), device=dev), layer)
            for layer in network.layers]
    x = torch.as_tensor(rows.to_dense(), device=dev)
    step = batch or max(1, rows.n_rows)

    def run() -> np.ndarray:
        parts = []
        for lo in range(0, x.shape[0], step):
            y = x[lo:lo + step]
            for w, b, layer in mats:
                y = _epilogue(torch, torch.addmm(b, y, w), layer)
            parts.append(y)
        return torch.cat(parts).cpu().numpy() if parts else np.zeros((0, mats[-1][0].shape[1]))

    with torch.inference_mode():
        return _timed(torch, dev, run, repeat)


@out_of_memory_is_a_skip("torch")
def torch_sparse_mlp_infer(network: Network, rows: SparseRows, *, batch: int | None = None,
                           repeat: int = 3) -> tuple[np.ndarray, float, list[float]]:
    """(final outputs, median seconds, all runs' seconds) with torch.sparse CSR weights."""
    torch, dev = torch_device("torch")
    mats = []
    for layer in network.layers:
        mats.append((torch_csr_t(torch, layer, dev),
                     torch.as_tensor(layer.bias_vector(), device=dev)[:, None], layer))
    xt = torch.as_tensor(rows.to_dense().T.copy(), device=dev)  # features x rows
    step = batch or max(1, rows.n_rows)

    def run() -> np.ndarray:
        parts = []
        for lo in range(0, xt.shape[1], step):
            y = xt[:, lo:lo + step]
            for wt, b, layer in mats:
                y = _epilogue(torch, wt @ y + b, layer)
            parts.append(y.T)
        return torch.cat(parts).cpu().numpy() if parts else np.zeros((0, mats[-1][0].shape[0]))

    with torch.inference_mode():
        return _timed(torch, dev, run, repeat)
