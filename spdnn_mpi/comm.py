"""All MPI in one place: partition, node-local placement, error agreement, gathers.

Functions take the communicator as an argument (only ``world()`` reaches for
``COMM_WORLD``). Ranks meet only at checkpoints and for the final gather, never
inside the layer loop.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from spdnn_mpi.errors import RankFailure, SpdnnError
from spdnn_mpi.model import ACTIVATIONS, Layer

T = TypeVar("T")


#: Environment variables a launcher sets in each process it starts, and which of them
#: gives the number of processes (None: the launcher is known, the count is not).
LAUNCHER_VARIABLES = (
    ("OMPI_COMM_WORLD_SIZE", True),  # Open MPI's mpirun/mpiexec
    ("PMI_SIZE", True),  # MPICH's and Intel MPI's hydra, srun --mpi=pmi2
    ("SLURM_STEP_NUM_TASKS", True),  # srun (not set in the batch script itself)
    ("PMIX_RANK", False),  # PMIx launchers (prterun, srun --mpi=pmix)
    ("MPI_LOCALNRANKS", False),  # MPICH hydra (a count per node, not of all processes)
    ("MV2_COMM_WORLD_SIZE", True),  # MVAPICH2's mpirun_rsh
    ("JSM_NAMESPACE_SIZE", True),  # IBM's jsrun
    ("FLUX_JOB_SIZE", True),  # flux run
    ("PALS_RANKID", False),  # HPE Cray PALS mpiexec
    ("ALPS_APP_PE", False),  # Cray's aprun
)

#: Variables a launcher sets to each process's rank (the first one set is read).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK",
                  "MV2_COMM_WORLD_RANK", "JSM_NAMESPACE_RANK", "FLUX_TASK_RANK", "PALS_RANKID",
                  "ALPS_APP_PE")


def launched_rank(environ: dict | None = None) -> str:
    """``rank R of P: `` for a process a launcher started as one of several (read from
    the launcher's variables, so it is safe where MPI cannot be called: a signal
    handler, a failed start), else ``""``."""
    environ = os.environ if environ is None else environ
    launched = launched_processes(environ)
    if launched is None or launched[1] == 1:
        return ""
    rank = next((environ[name] for name in RANK_VARIABLES if name in environ), "?")
    return f"rank {rank} of {launched[1] if launched[1] is not None else '?'}: "


def abort_others(status: int) -> None:
    """End every rank of this launch now (``MPI_Abort``), where MPI is running with several
    ranks: a rank stopped by a signal would otherwise wait in ``MPI_Finalize`` for ranks
    that go on working, and they would never learn it stopped."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    if mpi.COMM_WORLD.Get_size() > 1:
        sys.stderr.flush()
        mpi.COMM_WORLD.Abort(status)


INSTALL_HINT = (
    "install one: `pip install 'spdnn_mpi[mpich]'` (a pip-installed MPICH), or on a cluster "
    "load its MPI module and build mpi4py against it: "
    "`pip install --no-binary mpi4py mpi4py` (see README, Running on several GPUs or nodes)"
)


def launched_processes(environ: dict | None = None) -> tuple[str, int | None] | None:
    """(variable, process count or None) when a launcher started this process, else None."""
    environ = os.environ if environ is None else environ
    for name, gives_count in LAUNCHER_VARIABLES:
        value = environ.get(name)
        if value is None:
            continue
        if not gives_count:
            return name, None
        try:
            return name, int(value)
        except ValueError:
            return name, None
    return None


class SelfComm:
    """A one-rank ``MPI.COMM_WORLD`` with just what this package calls, so ``spdnn``
    runs where no MPI library is installed."""

    rank = 0
    size = 1

    def Get_rank(self) -> int:  # noqa: N802 - the mpi4py names
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 1

    def allgather(self, obj):
        return [obj]

    def gather(self, obj, root: int = 0):
        return [obj]

    def bcast(self, obj, root: int = 0):
        return obj

    def Bcast(self, buf, root: int = 0) -> None:  # noqa: N802
        pass

    def Free(self) -> None:  # noqa: N802
        pass


def world():
    """``MPI.COMM_WORLD`` where a launcher started this process as one of several (mpi4py
    imported on first use; an error where no MPI can load), else a :class:`SelfComm`:
    a lone process never loads MPI, whose start and finalize cost every run 0.06 s."""
    launched = launched_processes()
    if launched is None or launched[1] == 1:
        return SelfComm()
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as exc:
        count = "several" if launched[1] is None else str(launched[1])
        raise SpdnnError(
            f"started by an MPI launcher ({launched[0]}: {count} processes) but no MPI "
            f"library can be loaded ({str(exc).splitlines()[0] if str(exc) else exc!r}); "
            + INSTALL_HINT
        ) from None
    return MPI.COMM_WORLD


def agree_on_command(command: str) -> None:
    """Under a launcher of several processes, stop every rank unless all run the same
    subcommand (an MPMD launch gone wrong: a rank that runs ``info`` never joins the
    collectives of one that runs ``infer``, which would wait forever)."""
    launched = launched_processes()
    if launched is None or launched[1] == 1:
        return
    try:
        comm = world()
    except SpdnnError:
        if launched[1] is None:  # a launcher of unknown size and no MPI: run alone
            return
        raise
    commands = comm.allgather(command)
    for rank, theirs in enumerate(commands):
        if theirs != commands[0]:
            raise RankFailure(
                f"rank 0 runs `spdnn {commands[0]}`, rank {rank} runs `spdnn {theirs}`; "
                "every rank of one launch must run the same subcommand",
                rank, comm.Get_rank() == 0)


def check_agreement(comm, facts: dict[str, tuple[str, str]]) -> None:
    """Stop every rank when ranks were given different stores or options (they would
    otherwise hang in collectives of different sizes). ``facts``: name -> (value
    compared, value shown)."""
    everyone = comm.allgather(facts)
    first = everyone[0]
    for rank, theirs in enumerate(everyone[1:], start=1):
        for name in sorted(set(first) | set(theirs)):
            a, b = first.get(name, (None, "nothing")), theirs.get(name, (None, "nothing"))
            if a[0] != b[0]:
                raise RankFailure(  # every rank stops; rank 0 prints it, once
                    f"ranks disagree on {name}: rank 0 has {a[1]}, rank {rank} has {b[1]}; "
                    "every rank of one run needs the same store and options",
                    rank, comm.Get_rank() == 0,
                )


def partition(n_items: int, n_parts: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Contiguous split of ``n_items`` into ``n_parts`` ranges; returns bounds (n_parts + 1).

    Balanced by count, or by ``weights`` (e.g. input nonzeros per image). Every item
    lands in exactly one range; ranges may be empty.
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
    if isinstance(comm, SelfComm):
        return NodeInfo(0, 1, socket.gethostname()), SelfComm()
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


def gpu_index(node: NodeInfo, visible: int, oversubscribe: bool) -> int:
    """The device index this rank uses, by its rank within the node (``visible``: the
    devices it sees, one where the scheduler gives each task its own)."""
    if visible < 1:
        raise SpdnnError("the CUDA backend was asked for but no GPU is visible")
    if visible >= node.local_size:
        return node.local_rank
    if visible == 1 or oversubscribe:
        return node.local_rank % visible
    raise SpdnnError(
        f"{node.local_size} ranks on {node.hostname} but {visible} GPUs visible; "
        "start one rank per GPU or pass --oversubscribe-gpus"
    )


def check_gpu_sharing(node: NodeInfo, uuids: list[str], oversubscribe: bool) -> None:
    """Two ranks of a node on one physical GPU (``uuids``: each node-local rank's) is
    an error unless ``oversubscribe``; by UUID, so it also catches a scheduler that
    hands every task the same card. Raised on the node's rank 0 only (one message)."""
    if node.local_rank == 0 and len(set(uuids)) < len(uuids) and not oversubscribe:
        raise SpdnnError(
            f"{len(uuids)} ranks on {node.hostname} share {len(set(uuids))} GPU(s); "
            "start one rank per GPU or pass --oversubscribe-gpus"
        )


def checkpoint(comm, error: str | None) -> None:
    """Agree across ranks: if any rank failed (``error`` not None), every rank raises
    ``RankFailure`` naming the first failing rank, which alone prints it (``cli.main``).
    """
    errors = comm.allgather(error)
    failed = [rank for rank, err in enumerate(errors) if err is not None]
    if not failed:
        return
    first, size = failed[0], comm.Get_size()
    message = errors[first] if size == 1 else f"rank {first} of {size}: {errors[first]}"
    others = failed[1:]
    if others:
        same = all(errors[r] == errors[first] for r in others)
        listed = ", ".join(map(str, others[:8])) + (", ..." if len(others) > 8 else "")
        message += f" (also failed: rank(s) {listed}{', same error' if same else ''})"
    raise RankFailure(message, first, comm.Get_rank() == first)


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
    if comm.Get_size() == 1:
        return ids.copy()
    counts = comm.gather(len(ids), root=root)
    if comm.Get_rank() == root:
        from mpi4py import MPI

        out = np.empty(int(sum(counts)), dtype=np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        comm.Gatherv(ids, [out, counts, displs, MPI.INT64_T], root=root)
        return out
    comm.Gatherv(ids, None, root=root)
    return None


def sum_to_root(comm, values: np.ndarray, root: int = 0) -> np.ndarray:
    """Element-wise sum of every rank's int64 array, on ``root`` (zeros elsewhere)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    if comm.Get_size() == 1:
        return values.copy()
    total = np.zeros_like(values)
    comm.Reduce(values, total, root=root)
    return total


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


def broadcast_layers(comm, layers: list[Layer] | None, root: int = 0) -> list[Layer]:
    """The network's layers from ``root`` to every rank of ``comm`` (the node's
    reader shares what it read), array by array."""
    count = comm.bcast(None if layers is None else len(layers), root=root)
    out = []
    for k in range(count):
        arrays = layer_arrays(layers[k]) if comm.Get_rank() == root else None
        out.append(layer_from_arrays(broadcast_arrays(comm, arrays, root)))
    return out


def layer_arrays(layer: Layer) -> list[np.ndarray]:
    """A layer as plain arrays (shape and options in the first two) for sending."""
    meta = np.array([layer.n_in, layer.n_out, layer.values is None, layer.bias_is_scalar,
                     layer.clip is not None, ACTIVATIONS.index(layer.activation)],
                    dtype=np.int64)
    scalars = np.array([layer.uniform_value or 0.0, layer.bias if layer.bias_is_scalar else 0.0,
                        layer.clip or 0.0], dtype=np.float64)
    values = layer.values if layer.values is not None else np.zeros(0, np.float32)
    bias = np.zeros(0, np.float32) if layer.bias_is_scalar else layer.bias
    return [meta, scalars, layer.indptr, layer.indices, values, bias]


def layer_from_arrays(a: list[np.ndarray]) -> Layer:
    """The inverse of ``layer_arrays``."""
    meta, scalars, indptr, indices, values, bias = a
    n_in, n_out, uniform, scalar_bias, has_clip, activation = (int(x) for x in meta)
    return Layer(
        n_in, n_out, indptr, indices,
        None if uniform else values,
        float(scalars[0]) if uniform else None,
        float(scalars[1]) if scalar_bias else bias,
        float(scalars[2]) if has_clip else None,
        ACTIVATIONS[activation],
    )
