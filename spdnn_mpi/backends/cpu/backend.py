"""Fast CPU backend: fused gather + bias + activation + clip + row-alive flag (numba).

Rows are kept in neuron-major tiles (see ``kernels``); dead rows are
dropped by compacting the survivors into the spare buffer, so memory holds
features of live rows only, in two buffers swapped per layer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from spdnn_mpi.backends.base import Backend, BatchResult
from spdnn_mpi.check_policy import CheckCosts
from spdnn_mpi.compression import RowGroups
from spdnn_mpi.model import Layer, SparseRows
from spdnn_mpi.util.memory import available_bytes, small_page_array


class CpuBackend(Backend):
    """Numba kernels over neuron-major tiles, parallel over the rank's threads."""

    #: looks are free (every call runs to completion); a check over one tile took
    #: 0.30 ms and a layer over one tile 0.14 ms (N = 1024, 2-core Xeon VM)
    check_costs = CheckCosts(look=0.0, check=300e-6, layer=140e-6)

    name = "cpu"

    def __init__(self, threads: int | None = None, memory_fraction: float = 0.5) -> None:
        import numba

        from spdnn_mpi.backends.cpu import dispatch, share
        from spdnn_mpi.backends.cpu import kernels as cpu_kernels

        self._k = cpu_kernels
        self._dispatch = dispatch
        self._shared_inputs_all = share.shared_inputs_all
        self._calls = dispatch.KernelCalls()
        if threads is not None:
            numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
        self.threads = numba.get_num_threads()
        self._memory_fraction = memory_fraction
        self._layers: list[tuple] = []
        self.tile_rows = cpu_kernels.TILE_ROWS
        self._cur: np.ndarray | None = None
        self._spare: np.ndarray | None = None
        self._prepared = False
        self._compile = (0.0, False)  # the last network's kernel calls: (seconds, compiled)

    # -- network -----------------------------------------------------------
    def prepare_kernels(self, layers: Sequence[Layer]) -> None:
        """Compile (or load from numba's disk cache) the kernels these layers need."""
        self._calls.for_layers(layers)
        self._prepared = True

    def load_network(self, layers: Sequence[Layer], progress=None) -> None:
        """Keep references to the layers in the kernels' dtypes, and find the outputs
        that share input lists (``share``: all layers at once, over the threads)."""
        if not self._prepared:
            self._calls.for_layers(layers)
        self._prepared = False
        shares = self._shared_inputs_all(layers, self.threads)
        self._layers = [self._dispatch.layer_entry(lay, share)
                        for lay, share in zip(layers, shares)]
        self._calls.for_entries(self._layers)  # a kind the layers' first look missed
        self._compile = self._calls.take()
        self.width = max(max(lay.n_in, lay.n_out) for lay in layers) if layers else 0

    # -- features ----------------------------------------------------------
    def load_features(self, rows: SparseRows, drop_empty: bool) -> None:
        if rows.n_cols > self.width:
            raise ValueError(f"inputs have {rows.n_cols} columns, network is {self.width} wide")
        nnz = np.diff(rows.indptr)
        positions = np.flatnonzero(nnz > 0) if drop_empty else np.arange(rows.n_rows)
        self._pos = positions.astype(np.int64)
        n = len(positions)
        tr = self.tile_rows
        self._n_tiles = (n + tr - 1) // tr
        self._ensure_buffers(max(self._n_tiles, 1))
        self._cur_width = rows.n_cols
        values = rows.values if rows.values is not None else np.zeros(1, np.float32)
        self._k.scatter_rows(self._cur, self._n_tiles, positions, rows.indptr,
                             rows.indices, values, rows.values is None)
        self._live: list[int] = []
        self._layer_seconds: list[float] = []
        self._n_active = n

    def _ensure_buffers(self, n_tiles: int) -> None:
        """Two feature buffers of at least ``n_tiles`` tiles, reused across batches and runs.

        Reuse keeps page faults of fresh allocations out of later runs; a
        buffer more than twice too large is given back.
        """
        have = self._cur.shape[0] if self._cur is not None else 0
        if n_tiles <= have <= 2 * n_tiles and self._cur.shape[1] == self.width:
            return
        self._cur = self._spare = None
        shape = (n_tiles, self.width, self.tile_rows)
        self._cur = small_page_array(shape)  # see small_page_array: no compaction stalls
        self._spare = small_page_array(shape)
        self._k.first_touch(self._spare)  # the cur buffer is touched by scatter_rows
        self._alive = np.zeros(n_tiles * self.tile_rows, dtype=np.bool_)

    def run_layer(self, k: int, drop_dead: bool) -> None:
        t0 = time.perf_counter()
        self._run_layer(k, drop_dead)
        self._layer_seconds.append(time.perf_counter() - t0)

    def _run_layer(self, k: int, drop_dead: bool) -> None:
        entry = self._layers[k]
        kernel, args = self._dispatch.layer_kernel(entry, self._n_tiles, self._n_active)
        kernel(self._cur, self._spare, *args, self._alive)
        n_out = entry[7]
        self._cur, self._spare = self._spare, self._cur
        self._cur_width = n_out
        alive = self._alive[: self._n_active]
        n_alive = int(np.count_nonzero(alive))
        self._live.append(n_alive)
        if drop_dead and n_alive < self._n_active:
            dead = self._n_active - n_alive
            # Compact when a tenth of the rows died: moving the survivors costs
            # about as much as a layer's work on that tenth (measured on the
            # 1024 network: compacting after every death was slower).
            if dead * 10 >= self._n_active:
                keep = np.flatnonzero(alive)
                self._k.compact(self._cur, self._spare, n_out, keep)
                self._cur, self._spare = self._spare, self._cur
                self._pos = self._pos[keep]
                self._n_active = n_alive
                self._n_tiles = (n_alive + self.tile_rows - 1) // self.tile_rows
                self._alive[:n_alive] = True

    def merge_duplicate_rows(self) -> RowGroups:
        """Hash each held row, confirm candidates exactly, keep the first of each group."""
        t0 = time.perf_counter()
        n = self._n_active
        bits = self._cur.view(np.uint32)
        keys = self._k.row_hashes(bits, n, self._cur_width)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        head = np.empty(n, dtype=np.int64)
        head[order] = order[np.searchsorted(sorted_keys, sorted_keys, side="left")]
        merged = self._k.equal_to_head(bits, head, self._cur_width)
        members = np.flatnonzero(merged)
        groups = RowGroups(n, self._pos[~merged], self._pos[members], self._pos[head[members]])
        if len(members):
            keep = np.flatnonzero(~merged)
            alive = self._alive[keep]
            self._k.compact(self._cur, self._spare, self._cur_width, keep)
            self._cur, self._spare = self._spare, self._cur
            self._pos = self._pos[keep]
            self._n_active = len(keep)
            self._n_tiles = (len(keep) + self.tile_rows - 1) // self.tile_rows
            self._alive[: len(keep)] = alive
        if self._layer_seconds:  # the check belongs to the layer it follows
            self._layer_seconds[-1] += time.perf_counter() - t0
        return groups

    def live_count(self) -> int:
        return self._live[-1] if self._live else self._n_active

    def finish(self, want_features: bool,
               meanwhile: Callable[[], None] | None = None) -> BatchResult:
        if meanwhile is not None:
            meanwhile()
        if self._live:
            slots = np.flatnonzero(self._alive[: self._n_active])
        else:  # no layers: a row is alive when its input is nonzero
            slots = np.arange(self._n_active)
        features = None
        if want_features:
            features = self._k.gather_rows(self._cur, slots.astype(np.int64), self._cur_width)
        return BatchResult(self._pos[slots], self._live, self._layer_seconds, features)

    def release_buffers(self) -> None:
        """Give back the two feature buffers (``_ensure_buffers`` makes new ones)."""
        self._cur = self._spare = None

    def max_batch_rows(self, width: int) -> int | None:
        budget = self._memory_fraction * available_bytes()
        return max(self.tile_rows, int(budget // (2 * width * 4)))

    def describe(self) -> dict:
        return {
            "backend": "cpu",
            "threads": self.threads,
            "tile_rows": self.tile_rows,
            "cpu_count": os.cpu_count(),
            "kernel": "numba fused gather/bias/activation/clip/alive, neuron-major tiles",
            # uniform layers whose outputs share input lists: one sum per list
            "shared_sum_layers": sum(entry[-1] is not None for entry in self._layers),
            "compile_seconds": round(self._compile[0], 4),
            "kernels_compiled": self._compile[1],
        }


def cpu_categories(network, rows: SparseRows, progress=None) -> np.ndarray:
    """Sorted 1-based surviving ids computed by this backend (a fast truth source).

    The backend is tested against the plain reference; use this where the
    reference would take too long (large N x L). ``progress(layers done,
    detail)`` gets the engine's progress (a ``progress.Progress``).
    """
    from spdnn_mpi.engine import run_inference

    def engine_progress(done: int, _total: int, live: int, _seconds: float) -> None:
        progress(done, f"{live} rows live")

    backend = CpuBackend()
    backend.load_network(network.layers)
    return run_inference(network, rows, backend,
                         progress=engine_progress if progress is not None else None,
                         progress_every=0.0).categories()
