"""A network's layer files parsed on several cores and handed on in layer order.

``spdnn prepare`` writes layers one at a time, in order, through the store
writer; parsing them is most of its time. :class:`LayerReader` parses the
layer files of a ``neuron{N}`` folder (:class:`FolderLayers`) or of the
official archive (``formats.tsv.archive.ArchiveLayers``) in ``jobs`` worker
processes (``util.workers``; ``jobs`` 1 parses here, one layer at a time)
while the caller writes, and yields them in layer order. Memory stays
bounded: at most 2 x jobs batches of layers (one big layer, or small ones up
to ``BATCH_BYTES`` of text) are between being read and being handed on, and
layers that arrive early (an archive holds its members in the order
it was made in, not the layer order) are held up to ``HELD_BYTES``, then
kept in a scratch folder beside the output until their turn.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import stat
import tempfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.formats.tsv import tree as tsv_tree
from spdnn_mpi.formats.tsv.text import MemberText
from spdnn_mpi.model import Layer

#: Bytes of parsed layers held in memory while they wait for an earlier layer; beyond
#: it they wait on disk (N = 65536: about 200 layers in memory).
HELD_BYTES = 1 << 30
#: Text bytes (a gzip file counted as ``GZIP_RATIO`` times its size) sent to a worker in
#: one message: small layers go in batches (N = 1024: about 14), so that messages and
#: process switches stay few; a big layer goes alone.
BATCH_BYTES = 8 << 20
GZIP_RATIO = 6
#: Memory of a worker process besides its layer (Python, numpy, numba, the kernels), and
#: per byte of a layer's text while it is parsed (text blocks, ids, values, CSR): 8
#: layers of N = 65536 (52 MB of text each) measured 215 MB a worker.
WORKER_BYTES = 160 << 20
PER_TEXT_BYTE = 4


class FolderLayers:
    """Layers ``1..n_layers`` of a ``neuron{N}`` folder (by default all, a gap refused)."""

    def __init__(self, directory: str | os.PathLike, neurons: int | None = None,
                 n_layers: int | None = None) -> None:
        self.path = Path(directory)
        self.neurons = neurons or tsv_tree.infer_neurons(self.path)
        if n_layers is None:
            # all layers: a file missing in the middle is an error, not the end of the network
            n_layers = tsv_tree.count_layers(self.path, self.neurons)
            if n_layers == 0:
                tsv_tree.layer_path(self.path, self.neurons, 1)  # raises: names the first file
        if n_layers < 1:
            raise SpdnnError(f"--layers must be at least 1, got {n_layers}")
        self.n_layers = n_layers
        listed = tsv_tree.layer_files(self.path).get(self.neurons, {})
        # each file is looked at once (1920 files: milliseconds): whether it is one,
        # its size for the batches, its inode for the output check
        self.files: list[Path] = []
        self._stats: list[os.stat_result] = []
        for k in range(1, n_layers + 1):
            path, st = listed.get(k), None
            if path is not None:
                with contextlib.suppress(OSError):
                    st = path.stat()
            if st is None or not stat.S_ISREG(st.st_mode):
                path = tsv_tree.layer_path(self.path, self.neurons, k)  # raises: names it
                st = path.stat()
            self.files.append(path)
            self._stats.append(st)

    def text_sizes(self) -> list[int]:
        """About how many bytes of text each layer file holds (a gzip file counted as
        ``GZIP_RATIO`` times its size), in layer order."""
        return [st.st_size * (GZIP_RATIO if path.name.endswith(".gz") else 1)
                for path, st in zip(self.files, self._stats)]

    def sources(self, out: Path) -> dict[str, Path]:
        """The layer files that are ``out`` (through links too): the output must be none."""
        try:
            st = os.stat(out)
        except OSError:
            return {}  # no such file yet: none of the layer files (they exist) can be it
        return {f"the layer file {path.name}": path
                for path, other in zip(self.files, self._stats)
                if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)}

    def __iter__(self) -> Iterator[tuple[int, Path]]:
        return iter(enumerate(self.files, start=1))

    def useful_jobs(self, jobs: int) -> int:
        """``jobs``, but no more workers than batches of layer files to give them, nor
        than half the memory available holds: each is a process of its own."""
        from spdnn_mpi.util.memory import available_bytes

        sizes = self.text_sizes()
        batches = sum(1 for _ in _batches(iter(self), sizes, BATCH_BYTES))
        largest = max(sizes)
        fit = int(available_bytes() // 2 // (WORKER_BYTES + PER_TEXT_BYTE * largest))
        return max(1, min(jobs, batches, fit))

    def fraction(self) -> float | None:
        return None  # progress counts the layers written

    def count(self) -> int:
        return self.n_layers

    def describe(self) -> str:
        return f"{self.files[0].name} .. {self.files[-1].name}"


def _parse(task: tuple) -> tuple[int, Layer]:
    """One layer file (a path or an archive member's bytes) parsed and checked: (k, layer)."""
    k, source, neurons, bias, clip = task
    return k, tsv_tree.read_checked_layer(source, neurons, bias=bias, clip=clip)


def _parse_batch(tasks: list[tuple]) -> list[tuple[int, Layer]]:
    """:func:`_parse` of each task in turn (the first bad file raises)."""
    return [_parse(task) for task in tasks]


def _batches(tasks, sizes: list[int], limit: int, share: int = 1) -> Iterator[list[tuple]]:
    """Consecutive tasks (``sizes``: each one's text bytes) in lists of at most ``limit``
    bytes and at most 1/``share`` of the bytes not yet in a list, so that the last lists
    are small and the workers finish together; at least one task a list."""
    left = sum(sizes)
    batch: list[tuple] = []
    size, cap = 0, min(limit, left / share)
    for task, nbytes in zip(tasks, sizes):
        if batch and size + nbytes > cap:
            yield batch
            batch, size, cap = [], 0, min(limit, left / share)
        batch.append(task)
        size += nbytes
        left -= nbytes
    if batch:
        yield batch


def warm_kernels() -> None:
    """Load the parser's compiled kernels here, so forked workers start with them."""
    from spdnn_mpi.formats.tsv.read import read_layer  # imports numba

    read_layer(MemberText("warm-up", b"1\t1\t1\n"), 1, 1)


class _InOrder:
    """Layers arriving in any order, handed on in order 1, 2, ...: early ones wait in
    memory up to ``budget`` bytes, the rest in a scratch folder beside ``near``."""

    def __init__(self, near: Path, budget: int | None = None) -> None:
        self.next = 1
        self._near = near
        self._budget = HELD_BYTES if budget is None else budget
        self._memory: dict[int, Layer] = {}
        self._disk: dict[int, Path] = {}
        self._bytes = 0
        self._scratch: Path | None = None

    def put(self, k: int, layer: Layer) -> list[Layer]:
        """Take layer ``k``; returns the layers now ready, in order (maybe none)."""
        if k != self.next:
            self._hold(k, layer)
            return []
        ready = [layer]
        self.next += 1
        while (held := self._take(self.next)) is not None:
            ready.append(held)
            self.next += 1
        return ready

    def _hold(self, k: int, layer: Layer) -> None:
        size = _nbytes(layer)
        if self._bytes + size <= self._budget:
            self._memory[k] = layer
            self._bytes += size
            return
        from spdnn_mpi.util.atomic import temporary_prefix, write_error

        try:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(
                    prefix=f"{temporary_prefix(self._near)}layers-", dir=self._near.parent))
            path = self._scratch / f"layer-{k}.pickle"
            with open(path, "wb") as f:
                pickle.dump(layer, f, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError as exc:
            raise write_error(self._scratch or self._near.parent, exc) from None
        self._disk[k] = path

    def _take(self, k: int) -> Layer | None:
        if k in self._memory:
            layer = self._memory.pop(k)
            self._bytes -= _nbytes(layer)
            return layer
        if k in self._disk:
            path = self._disk.pop(k)
            with open(path, "rb") as f:
                layer = pickle.load(f)  # written by _hold above, in this run
            path.unlink()
            return layer
        return None

    def close(self) -> None:
        self._memory.clear()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def _nbytes(layer: Layer) -> int:
    values = 0 if layer.values is None else np.asarray(layer.values).nbytes
    return np.asarray(layer.indptr).nbytes + np.asarray(layer.indices).nbytes + values


def _thread_map(pool, tasks, window: int) -> Iterator[tuple[int, Layer]]:
    """:func:`_parse` of each task on ``pool``'s threads, in task order, at most
    ``window`` tasks taken and not yet handed on."""
    pending: deque = deque()
    for task in tasks:
        pending.append(pool.submit(_parse, task))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


class LayerReader:
    """The layers of ``source`` (:class:`FolderLayers` or ``ArchiveLayers``) in layer
    order, parsed on ``jobs`` cores: layer files of a folder in worker processes,
    which read them themselves; archive members, already read into this process
    (by a thread that decompresses the archive), in threads, as the parser's
    kernels run without the GIL (sending the bytes to processes cost more than the
    parse). Use as a context manager, which stops the workers and drops the scratch
    folder on the way out, also on errors and interrupts. ``near``: the output,
    beside which early layers may wait. Call :func:`warm_kernels` first, so the
    workers start with the parser's kernels instead of each loading them."""

    def __init__(self, source, *, bias: float, clip: float | None, jobs: int,
                 near: str | os.PathLike) -> None:
        if jobs < 1:
            raise SpdnnError(f"--jobs {jobs}: must be at least 1")
        self.source = source
        self.bias = bias
        self.clip = clip
        self.jobs = jobs
        self._order = _InOrder(Path(near))
        self._pool = None
        self._threads = None

    def __enter__(self) -> LayerReader:
        if self.jobs > 1 and getattr(self.source, "in_memory", False):
            from concurrent.futures import ThreadPoolExecutor

            self._threads = ThreadPoolExecutor(self.jobs, thread_name_prefix="spdnn-parse")
        elif self.jobs > 1:
            from spdnn_mpi.util.workers import WorkerPool

            self._pool = WorkerPool(_parse_batch, self.jobs)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        close = getattr(self.source, "close", None)  # an archive's thread reading ahead
        if close is not None:
            close()
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
            self._threads = None
        self._order.close()
        if self._pool is not None:
            self._pool.close(graceful=exc_type is None)
            self._pool = None

    def __iter__(self) -> Iterator[Layer]:
        tasks = ((k, item, self.source.neurons, self.bias, self.clip)
                 for k, item in self.source)
        if self._threads is not None:
            parsed = _thread_map(self._threads, tasks, window=2 * self.jobs)
        elif self._pool is not None:
            window = 2 * self.jobs  # batches out at once: the last ones a share of that
            parsed = self._pool.map(_batches(tasks, self.source.text_sizes(), BATCH_BYTES,
                                             share=window), window=window, flat=True)
        else:
            parsed = map(_parse, tasks)
        for k, layer in parsed:
            yield from self._order.put(k, layer)
        n_layers = self.source.count()  # a missing layer is an error naming it
        if self._order.next != n_layers + 1:  # pragma: no cover - count() said all are there
            raise SpdnnError(f"{self.source.path}: layer {self._order.next} was not read")


def open_layers(weights: str | os.PathLike, neurons: int | None = None,
                n_layers: int | None = None):
    """:class:`FolderLayers` for a folder, ``ArchiveLayers`` for any other file."""
    from spdnn_mpi.formats.tsv.archive import ArchiveLayers

    weights = Path(weights)
    if n_layers is not None and n_layers < 1:
        raise SpdnnError(f"--layers must be at least 1, got {n_layers}")
    if weights.is_dir():
        return FolderLayers(weights, neurons, n_layers)
    if weights.exists():
        return ArchiveLayers(weights, neurons, n_layers)
    raise SpdnnError(f"{weights}: no such weights folder or archive")
