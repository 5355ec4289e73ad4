"""All MPI in one place: partition, node-local placement, error agreement, gathers.

Functions take the communicator as an argument; nothing here reaches for
``COMM_WORLD`` on its own except ``world()``, which the driver calls once.
There is no communication inside the layer loop: ranks meet only at
checkpoints (after loading, after inference) and for the final gather.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from spdnn_mpi.errors import SpdnnError

T = TypeVar("T")


def world():
    """``MPI.COMM_WORLD`` (imports mpi4py on first use, with a clear error)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SpdnnError(
            f"mpi4py cannot be imported ({exc}); install an MPI (e.g. `pip install mpich`) "
            "or build mpi4py against your cluster's MPI (see README)"
        ) from None
    return MPI.COMM_WORLD


def partition(n_items: int, n_parts: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Contiguous split of ``n_items`` into ``n_parts`` ranges; returns bounds (n_parts + 1).

    Balanced by count, or by the cumulative ``weights`` (e.g. input nonzeros
    per image) when given. Every item lands in exactly one range; ranges may
    be empty when there are more parts than items.
    """
    if n_parts < 1:
        raise ValueError("n_parts must be >= 1")
    if weights is None:
        return np.array([(n_items * p) // n_parts for p in range(n_parts + 1)], dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) != n_items:
        raise ValueError(f"{len(weights)} weights for {n_items} items")
    cum = np.concatenate([[0.0], np.cumsum(weights)])
    targets = cum[-1] * np.arange(n_parts + 1) / n_parts
    bounds = np.searchsorted(cum, targets, side="left").astype(np.int64)
    bounds[0], bounds[-1] = 0, n_items
    return np.maximum.accumulate(np.minimum(bounds, n_items))


@dataclass
class NodeInfo:
    """Where a rank sits: its rank and size within the node, and the node's name."""

    local_rank: int
    local_size: int
    hostname: str


def node_info(comm) -> tuple[NodeInfo, Any]:
    """(this rank's placement, the node-local communicator) by shared-memory split."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    return NodeInfo(local.Get_rank(), local.Get_size(), socket.gethostname()), local


def cpu_threads_per_rank(local_size: int, requested: int | None) -> int:
    """Threads for a CPU rank: the user's number, else usable cores / ranks on the node."""
    if requested is not None:
        if requested < 1:
            raise SpdnnError("--threads must be >= 1")
        return requested
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_size))


def choose_gpu(node: NodeInfo, local_comm, visible: int, uuid_of: Callable[[int], str],
               oversubscribe: bool) -> int:
    """The device index this rank uses, by its rank within the node.

    Honours CUDA_VISIBLE_DEVICES and schedulers that give each task its own
    GPU (then every rank sees one device, index 0). Two ranks on one physical
    GPU is an error unless ``oversubscribe``: detected by device UUID, so it
    also catches a scheduler that hands every task the same card.
    """
    if visible < 1:
        raise SpdnnError("the CUDA backend was asked for but no GPU is visible")
    if visible >= node.local_size:
        device = node.local_rank
    elif visible == 1 or oversubscribe:
        device = node.local_rank % visible
    else:
        raise SpdnnError(
            f"{node.local_size} ranks on {node.hostname} but {visible} GPUs visible; "
            "start one rank per GPU or pass --oversubscribe-gpus"
        )
    uuids = local_comm.allgather(uuid_of(device))
    if len(set(uuids)) < len(uuids) and not oversubscribe:
        raise SpdnnError(
            f"{len(uuids)} ranks on {node.hostname} share {len(set(uuids))} GPU(s); "
            "start one rank per GPU or pass --oversubscribe-gpus"
        )
    return device


def checkpoint(comm, error: str | None) -> None:
    """Agree across ranks: if any rank failed, every rank raises the first failure.

    Each rank arrives with its own error (or None), so a failing rank never
    leaves the others waiting in a later collective.
    """
    errors = comm.allgather(error)
    for rank, err in enumerate(errors):
        if err is not None:
            raise SpdnnError(f"rank {rank} of {comm.Get_size()}: {err}")


def run_phase(comm, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank, then ``checkpoint`` with its error, if any."""
    result: Any = None
    error = None
    try:
        result = fn()
    except SpdnnError as exc:
        error = str(exc)
    except MemoryError:
        error = "out of host memory"
    except Exception as exc:  # any rank-local failure must reach the others
        error = f"{type(exc).__name__}: {exc}"
        if os.environ.get("SPDNN_DEBUG"):
            traceback.print_exc()
    checkpoint(comm, error)
    return result


def gather_ids(comm, ids: np.ndarray, root: int = 0) -> np.ndarray | None:
    """Concatenate every rank's int64 ids on ``root`` (in rank order)."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    counts = comm.gather(len(ids), root=root)
    if comm.Get_rank() == root:
        out = np.empty(int(sum(counts)), dtype=np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        comm.Gatherv(ids, [out, counts, displs, _mpi_int64()], root=root)
        return out
    comm.Gatherv(ids, None, root=root)
    return None


def _mpi_int64():
    from mpi4py import MPI

    return MPI.INT64_T


def broadcast_arrays(comm, arrays: list[np.ndarray] | None, root: int = 0) -> list[np.ndarray]:
    """Send a list of numpy arrays from ``root`` to every rank of ``comm`` (no pickling of data)."""
    meta = comm.bcast(
        None if arrays is None else [(a.shape, a.dtype.str) for a in arrays], root=root
    )
    out = []
    for k, (shape, dtype) in enumerate(meta):
        buf = arrays[k] if comm.Get_rank() == root else np.empty(shape, dtype=np.dtype(dtype))
        buf = np.ascontiguousarray(buf)
        if buf.size:
            comm.Bcast(buf, root=root)
        out.append(buf)
    return out
