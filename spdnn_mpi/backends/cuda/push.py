"""The push forms of layers on the CUDA backend (``cuda/spdnn_push.cu``).

Pulling, every output gathers all of its inputs from dense tiles, zeros
included; pushing, each nonzero input adds its weights to the outputs it
feeds: the first layer straight from the sparse input rows (a digit's pixels
are about 19 % nonzero), a later one from the tiles (its ReLU zeros). The
sums are the pulling kernels' bit for bit only where each output's inputs
are added in the same order and the skipped terms add nothing; this module
says where that holds, decides per batch, and builds the layout. Host logic
only, so it is tested without a GPU. Off by default (``SPDNN_PUSH``): both
forms measured about 2x slower than pulling for the first layer of the MNIST
models at 1000 digits (docs/performance.md, "Session 18", "Session 19").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spdnn_mpi.model import Layer, SparseRows

#: ``SPDNN_PUSH`` (a host setting among the defines): 0 never push, 1 (auto)
#: layers with per-weight values when a batch's inputs are sparse enough,
#: 2 whenever it is exact (tests, and measuring it on uniform layers).
PUSH_OFF, PUSH_AUTO, PUSH_ALWAYS = 0, 1, 2


def strictly_sorted_rows(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Whether every CSR row's indices strictly increase (sorted, no repeats)."""
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size < 2:
        return True
    step = np.diff(idx)
    ends = np.asarray(indptr, dtype=np.int64)[1:-1] - int(indptr[0]) - 1  # last entry of a row
    ends = ends[(ends >= 0) & (ends < step.size)]
    inside = np.ones(step.size, dtype=bool)
    inside[ends] = False
    return bool(np.all(step[inside] > 0))


def push_exact(layer: Layer) -> bool:
    """Whether pushing reproduces the CSR kernels' sums of ``layer`` bit for bit:
    its rows are sorted (adds in ascending input order either way) and every
    weight is finite (a skipped zero input then adds +0 or -0, which leaves an
    accumulator that starts at +0 as it was)."""
    if layer.values is not None:
        finite = bool(np.all(np.isfinite(layer.values)))
    else:
        finite = bool(np.isfinite(layer.uniform_value))
    small = layer.nnz < 2**31  # int32 entry offsets
    return finite and small and strictly_sorted_rows(layer.indptr, layer.indices)


def may_push(mode: int, layer: Layer) -> bool:
    """Whether batches may push ``layer`` (the first) under ``mode``: auto
    pushes layers with per-weight values only, and only where it is exact."""
    if mode == PUSH_OFF or (mode == PUSH_AUTO and layer.values is None):
        return False
    return push_exact(layer)


def wants_push(mode: int, rows: SparseRows, max_density: float) -> bool:
    """Whether a batch of ``rows`` pushes the first layer (``may_push`` held):
    under auto only if at most ``max_density`` of its inputs are nonzero, and
    only if its rows are sorted (their order is the order of the adds)."""
    if mode == PUSH_OFF or rows.n_rows == 0:
        return False
    if mode == PUSH_AUTO and rows.nnz > max_density * rows.n_rows * max(1, rows.n_cols):
        return False
    return strictly_sorted_rows(rows.indptr, rows.indices)


@dataclass
class PushLayout:
    """What ``layer_push`` reads: for chunk c and input k, entries
    ``ptr[c * (n_in + 1) + k]`` up to the next of ``outs`` (output within the
    chunk) and ``weights`` (one float when uniform)."""

    chunk: int  # outputs a chunk
    n_chunks: int
    ptr: np.ndarray  # int32, n_chunks * (n_in + 1) + 1
    outs: np.ndarray  # uint16, one per weight
    weights: np.ndarray  # float32, one per weight (or one)


def push_layout(layer: Layer, chunk: int) -> PushLayout:
    """The weights of ``layer`` by (output chunk, input, output): W rather than
    its transpose, cut into chunks of ``chunk`` outputs (at most 65536)."""
    chunk = max(1, min(int(chunk), layer.n_out, 65536))
    n_chunks = -(-layer.n_out // chunk)
    deg = np.diff(np.asarray(layer.indptr, dtype=np.int64))
    out = np.repeat(np.arange(layer.n_out, dtype=np.int64), deg)
    k = np.asarray(layer.indices, dtype=np.int64)
    c = out // chunk
    order = np.lexsort((out, k, c))
    bucket = c[order] * (layer.n_in + 1) + k[order]
    counts = np.bincount(bucket, minlength=n_chunks * (layer.n_in + 1))
    ptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    if layer.values is None:
        weights = np.zeros(1, dtype=np.float32)
    else:
        weights = np.asarray(layer.values, dtype=np.float32)[order]
    return PushLayout(chunk, n_chunks, ptr.astype(np.int32),
                      (out[order] - c[order] * chunk).astype(np.uint16), weights)


def push_kernel(layer: Layer, dense: bool = False, itype: str = "u16") -> str:
    """NVRTC name of the push kernel for ``layer``: from the input rows, whose
    indices are ``itype`` (u16 or int), or, ``dense``, from the tiles."""
    vals = "true" if layer.values is not None else "false"
    return f"layer_push_dense<{vals}>" if dense else f"layer_push<{vals},{itype}>"
