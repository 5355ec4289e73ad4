"""The CUDA backend's layer loop: queued layers launched, when the host must look
at the device, as cached CUDA graphs or one by one; the compaction passes between
them; the gather that ends a batch. Host logic, tested with fakes on any machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.features import FeatureBuffers
from spdnn_mpi.backends.cuda.graphs import GraphCache
from spdnn_mpi.backends.cuda.held import HeldLayers
from spdnn_mpi.backends.cuda.launch import LayerLaunch
from spdnn_mpi.backends.cuda.readback import PackedResults
from spdnn_mpi.backends.cuda.whole import WholeNetwork


class LayerQueue:
    """Layers queued on one stream, launched in pieces (graphs or direct)."""

    def __init__(self, buffers: FeatureBuffers, results: PackedResults, device: Any,
                 stream: Any, sms: int, graphs: bool = True) -> None:
        self._buffers = buffers  # the pointer table and state every kernel takes
        self._results = results  # the gather's array and its host copy
        self._device = device  # a CuPy Device (context manager)
        self._stream = stream
        self._sms = sms
        self.graphs = GraphCache(graphs)
        self.layers: list[LayerLaunch] = []
        self._held: HeldLayers | None = None  # converged layers in one launch
        self._whole: WholeNetwork | None = None  # every layer in one launch (small batches)
        self._compact = None  # compact_rows
        self._gather = None  # gather_results
        self.pending: list[tuple[int, bool]] = []  # (layer, drop dead rows) not launched yet
        self.held = 0  # > 0: at most this many rows (one tile) held since a merge
        self.merging = False  # merges ran: graphs are captured in every held-rows form
        self.capture_seconds = 0.0  # host time capturing graphs, the device idle meanwhile
        # the last finish's (shape and buffers, read plan, gather, the results' array)
        self._finish_plan: tuple | None = None
        # (layers, rows held, gather, rows loaded, graph) of the last graph launched: a
        # small batch run again skips building its key and looking it up (4.6-6.9 us
        # of an 84-132 us run of a pruned model at 1000 images, H100)
        self._last_graph: tuple | None = None

    def attach(self, module: Any, layers: list[LayerLaunch], held: HeldLayers | None = None,
               whole: WholeNetwork | None = None) -> None:
        """A new network: its layers, the module's loop kernels, (``held``) its
        converged layers' one-launch form and (``whole``) its small batches'; no graph
        kept."""
        self.layers = layers
        self._held = held
        self._whole = whole
        self._compact = module.get_function("compact_rows")
        self._gather = module.get_function("gather_results")
        self.graphs.clear()
        self._finish_plan = None
        self._last_graph = None

    def start_batch(self) -> None:
        """A new batch: nothing queued, every row held in tiles."""
        self.pending = []
        self.held = 0

    def add(self, k: int, drop_dead: bool) -> None:
        """Queue layer ``k``; then drop all-zero rows if ``drop_dead``."""
        self.pending.append((k, bool(drop_dead)))

    def launch(self, k: int, drop_dead: bool, held: int) -> None:
        """Enqueue one layer (and the compaction it may ask for). ``held`` > 0: at
        most that many rows (one tile) are held, so a few blocks compute only those
        rows and nothing is compacted (dead rows stay zero, which is exact)."""
        b = self._buffers
        layer = self.layers[k]
        kk = np.int32(k)
        drop = drop_dead and not held
        launch, extra = layer.form(held)
        args = (b.ptrs, *layer.head, b.state, b.live_hist, b.stamps, kk,
                np.int32(1 if drop else 0), *extra)
        launch.kern((launch.grid,), (launch.threads,), args, shared_mem=launch.smem)
        self._compact_after(k, drop)

    def _launch_tile_run(self, k0: int, n_layers: int, drop_dead: bool) -> None:
        """Enqueue layers ``k0`` on over every tile in one launch: first the compaction
        the layer before may have asked for (a run makes none inside it), after it
        the pass its own last plan may ask for where the next layer does not compact
        on write (as ``launch``)."""
        b = self._buffers
        self.compact(k0 - 1)
        self._held.launch_run(b.ptrs, b.state, b.live_hist, b.stamps, k0, n_layers, drop_dead)
        self._compact_after(k0 + n_layers - 1, drop_dead)

    def _compact_after(self, k: int, drop: bool) -> None:
        """After layer ``k`` (``drop``: its plan may compact), the ``compact_rows`` pass
        where layer ``k + 1`` does not write the compaction itself."""
        if drop and not self.compacts_on_write(k + 1):
            self.compact(k)

    def compact(self, k: int) -> None:
        """Enqueue ``compact_rows`` after layer ``k``: it moves the survivors to dense
        tiles if the layer's plan asked for it, and does nothing otherwise."""
        b = self._buffers
        self._compact((self._sms * 8,), (256,),
                      (b.ptrs, np.int32(self.layers[k].n_out), b.state, b.stamps, np.int32(k)))

    def compacts_on_write(self, k: int) -> bool:
        """Whether layer ``k`` writes the compaction its predecessor may ask for
        (no compact_rows pass before it). The last layer's is left pending:
        ``finish`` reads the survivors from the mask, and a merge runs it first."""
        if k >= len(self.layers):
            return True
        return lay.compacts_on_write(self.layers[k].plan.kind)

    def flush(self, gather: tuple | None = None) -> None:
        """Launch the queued layers: a cached graph when possible, else one by one.

        ``gather``: (grid, args, tail, copy words) of a ``gather_results`` launch (and
        copy to the host) to end the piece with; ``tail`` is its part of the graph key.
        """
        if not self.pending and gather is None:
            return
        todo, self.pending = tuple(self.pending), []
        cache = self.graphs
        if todo and cache.on:
            rows, last = self._buffers.loaded_rows, self._last_graph
            if (last is not None and last[2] is gather and last[0] == todo
                    and last[1] == self.held and last[3] == rows):
                graph = last[4]
            else:
                graph = cache.get(self._key(todo, self.held, gather))
            if graph is None:
                t0 = time.perf_counter()
                with self._device, self._stream:
                    graph = self._capture(todo, self.held, gather)
                    # every form while merging, so a timed run captures nothing
                    for held in (0, *lay.ELL_ROWS) if self.merging else ():
                        if held != self.held:
                            self._capture(todo, held, gather)
                self.capture_seconds += time.perf_counter() - t0
            if graph is not None:
                self._last_graph = (todo, self.held, gather, rows, graph)
                with self._device:  # the stream is named: no current-stream switch
                    graph.launch(stream=self._stream)
                return
        with self._device, self._stream:
            self._run_piece(todo, self.held, gather)

    def finish(self, n_run: int, width: int, want_features: bool,
               meanwhile: Callable[[], None] | None = None) -> np.ndarray:
        """Launch what is queued, then ``gather_results`` and the copy of its packed
        array (``readback``); run ``meanwhile``, wait and return the array on the host."""
        read, gather = self._finish_args(n_run, width, want_features)
        self.flush(gather=gather)
        if meanwhile is not None:
            meanwhile()
        return self._results.fetch(self._stream, read)

    def _finish_args(self, n_run: int, width: int, want_features: bool) -> tuple:
        """(read plan, ``flush``'s gather) of a batch's end, made again only when the
        batch's shape or the results' buffers changed, where a small batch's timed
        part built them again for each run."""
        b, results = self._buffers, self._results
        kept = self._finish_plan
        if (kept is not None and kept[3] is results.device
                and kept[0] == (n_run, width, want_features, b.loaded_rows, results.allocations)):
            return kept[1], kept[2]
        read = results.prepare(n_run, width, want_features, b.loaded_rows)
        blocks = max(1, min(-(-max(b.loaded_rows, read.head) // 256), self._sms * 8))
        # the graph key: the other arrays of the gather were made with the network
        tail = (blocks, n_run, width, want_features, results.copy_key(read.copy))
        gather = (blocks, (b.ptrs, b.state, b.live_hist, b.stamps, np.int32(n_run),
                           np.int32(width), np.int32(want_features), results.device),
                  tail, read.copy)
        # the key names the buffers prepare left (it may have allocated)
        self._finish_plan = ((n_run, width, want_features, b.loaded_rows, results.allocations),
                             read, gather, results.device)
        return read, gather

    def _key(self, todo: tuple, held: int, gather: tuple | None) -> tuple:
        tail = None if gather is None else gather[2]
        return self.graphs.key(todo, held, (tail, self._whole_grid(todo, held)))

    def _whole_grid(self, todo: tuple, held: int) -> int:
        """Blocks of the one launch that runs ``todo`` (``whole``), 0 where it does not."""
        if self._whole is None:
            return 0
        return self._whole.grid(todo, held, self._buffers.loaded_rows)

    def _run_piece(self, todo: tuple, held: int, gather: tuple | None) -> None:
        """Enqueue the layers of ``todo`` (then the gather and its copy) on the stream:
        every layer of a small batch as one launch (``whole``); else consecutive
        shared-sum grouped layers as one launch: over the rows held, or
        (``held.HeldLayers.tile_run_length``) over every tile once the rows settled."""
        b, i = self._buffers, 0
        whole = self._whole_grid(todo, held)
        if whole:
            self._whole.launch(whole, b.ptrs, b.state, b.live_hist, b.stamps)
            i = len(todo)
        while i < len(todo):
            n = 1
            if self._held is not None:
                n = (self._held.run_length(todo, i) if held
                     else self._held.tile_run_length(todo, i))
            if n > 1 and held:  # nothing is compacted while rows are held
                self._held.launch(b.ptrs, b.state, b.live_hist, b.stamps, todo[i][0], n, held)
            elif n > 1:
                self._launch_tile_run(todo[i][0], n, todo[i + n - 1][1])
            else:
                self.launch(*todo[i], held)
            i += n
        if gather is not None:
            self._gather((gather[0],), (256,), gather[1])
            if gather[3]:
                self._results.enqueue_copy(self._stream, gather[3])

    def _capture(self, todo: tuple, held: int, gather: tuple | None = None):
        """The graph of ``todo`` (then ``gather``) with ``held`` rows, captured now."""
        return self.graphs.capture(self._stream, self._key(todo, held, gather),
                                   lambda: self._run_piece(todo, held, gather))
