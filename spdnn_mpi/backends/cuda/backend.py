"""CUDA backend: one fused kernel per layer, dead rows dropped on the device.

Features live in two device buffers of 32-row tiles, neuron-major
(``cuda/spdnn_common.cuh``). Each layer is one persistent kernel whose last
block counts the live rows and decides whether to compact; when that frees
enough tiles the next layer writes the survivors to dense tiles as it
computes them (or, before a kernel that cannot, a second kernel moves them).
The host enqueues the layers and never waits until ``finish``: live counts,
the buffer in use and per-layer timestamps stay on the device.

CuPy is imported lazily, so this module can be imported without it; building
a ``CudaBackend`` without CuPy raises a clear ``SpdnnError``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import numpy as np

from spdnn_mpi.backends.base import Backend, BatchResult
from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.compile import (  # noqa: F401 (import_cupy: used by callers)
    compiled_module,
    import_cupy,
    kernel_names,
)
from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.backends.cuda.graphs import GraphCache
from spdnn_mpi.backends.cuda.launch import Launcher, LayerLaunch, blocks_per_sm
from spdnn_mpi.backends.cuda.merge import DeviceMerge
from spdnn_mpi.backends.cuda.readback import (
    ST_COMPACTIONS,
    ST_ROWS,
    ST_SIZE,
    ST_TILES,
    PackedResults,
    unpack_results,
)
from spdnn_mpi.compression import RowGroups, fall_rule
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Layer, SparseRows

#: Pointer table: buf0, buf1, pos0, pos1, masks, tile_base, tstride, max_tiles.
P_SIZE = 8


class CudaBackend(Backend):
    """The engine's backend on one NVIDIA GPU (``backends.base.Backend``)."""

    name = "cuda"
    tile_rows = lay.TILE_ROWS
    #: a look at a checkpoint waits for the device and cuts the graph: on an
    #: H200, 1000 images through a 3-layer 1024-wide MNIST model took 0.90 ms
    #: with the looks after layers 1 and 2 against 0.22 ms without; with fewer
    #: layers left than this there is too little to save
    check_min_layers_left = 8
    #: warm up on the whole batch: the graph of a batch ends with a gather
    #: sized by its rows, so a smaller warm-up left the capture in the first
    #: timed run (an H100, 1024 x 1920 off: runs of 0.173, 0.076, 0.027 s)
    warm_up_rows = None

    def __init__(
        self,
        device: int | None = None,
        variant: str = "auto",
        memory_fraction: float = 0.9,
        config: KernelConfig | None = None,
        graphs: bool = True,
    ) -> None:
        lay.check_variant(variant)  # before CuPy, so a typo fails fast anywhere
        cp = import_cupy()
        self._cp = cp
        try:
            n_dev = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:
            raise SpdnnError(f"no usable CUDA device: {exc}") from exc
        if n_dev < 1:
            raise SpdnnError("no CUDA device visible")
        if device is None:
            device = cp.cuda.runtime.getDevice()
        if not 0 <= device < n_dev:
            raise SpdnnError(f"CUDA device {device} does not exist ({n_dev} visible)")
        self.device_id = int(device)
        self._dev = cp.cuda.Device(self.device_id)
        props = cp.cuda.runtime.getDeviceProperties(self.device_id)
        self._props = props
        self.sms = int(props["multiProcessorCount"])
        self._smem_optin = int(props["sharedMemPerBlockOptin"])
        self.variant = variant
        self._memory_fraction = memory_fraction
        self.config = config or KernelConfig()
        with self._dev:
            self._stream = cp.cuda.Stream(non_blocking=True)
        self._layers: list[LayerLaunch] = []
        self._mod = None
        self._n_layers = 0
        self.width = 0
        self._layers_run = 0
        self._cap_tiles = 0
        self._graph_cache = GraphCache(graphs)
        self._pending: list[tuple[int, bool]] = []
        self._peak = 0
        self._info: dict = {}
        self._batch_live: list[int] = []
        self._held = 0  # > 0: at most this many rows (one tile) held since a merge
        self._merging = False  # merges ran: graphs are captured in both forms
        self._results = PackedResults(cp, self._dev)  # gather_results' array, its host copy

    # -- helpers -------------------------------------------------------------
    def _track_peak(self) -> None:
        pool = self._cp.get_default_memory_pool()
        self._peak = max(self._peak, int(pool.total_bytes()))

    # -- network -------------------------------------------------------------
    def load_network(self, layers: Sequence[Layer], progress=None) -> None:
        """Upload each layer's kernel layout (``progress(layers done)`` after each); compile."""
        cp = self._cp
        t0 = time.perf_counter()
        smem_limit = self._smem_optin - 1024
        plans = [lay.plan_layer(layer, smem_limit, self.variant) for layer in layers]
        names = kernel_names({p.degree for p in plans if p.degree})
        t_compile = time.perf_counter()
        self._mod = compiled_module(self.device_id, sorted(names), self.config)
        compile_s = time.perf_counter() - t_compile
        self._compact = self._mod.get_function("compact_rows")
        self._stamp = self._mod.get_function("stamp")
        self._gather = self._mod.get_function("gather_results")
        self._merger = DeviceMerge(cp, self._mod, self.sms)
        self._scatter = {
            "u16": self._mod.get_function("scatter_rows<u16>"),
            "int": self._mod.get_function("scatter_rows<int>"),
        }
        kinds: dict[str, int] = {}
        forms: dict[str, int] = {}  # kernels by name (layer_group_sum<32>, ...)
        layout_bytes = 0
        width = 0
        self._layers = []
        launcher = Launcher(cp, self._mod, self.config, self.sms, self.variant,
                            functools.partial(blocks_per_sm, self._props))
        with self._dev, self._stream:
            for layer, plan in zip(layers, plans):
                entry = launcher.layer_entry(layer, plan, smem_limit)
                kind = entry.plan.kind
                kinds[kind] = kinds.get(kind, 0) + 1
                forms[entry.plan.kernel] = forms.get(entry.plan.kernel, 0) + 1
                layout_bytes += entry.layout_bytes
                self._layers.append(entry)
                width = max(width, layer.n_in, layer.n_out)
                if progress is not None:
                    progress(len(self._layers))
            self._stream.synchronize()
        self.width = width
        self._n_layers = len(layers)
        with self._dev:
            self._live_hist = cp.zeros(max(1, len(layers)), dtype=np.int32)
            self._stamps = cp.zeros(len(layers) + 1, dtype=np.uint64)
            self._state = cp.zeros(ST_SIZE, dtype=np.int32)
            self._ptrs = cp.zeros(P_SIZE, dtype=np.int64)
        self._graph_cache.clear()
        self._cap_tiles = 0
        self._track_peak()
        self._info = {
            "kernels": kinds,
            "kernel_names": forms,
            "layout_bytes": layout_bytes,
            "layout_seconds": round(time.perf_counter() - t0 - compile_s, 4),
            "compile_seconds": round(compile_s, 4),
            "grids": sorted({(e.plan.kind, e.full.grid, e.full.threads) for e in self._layers}),
        }

    # -- features ------------------------------------------------------------
    def _ensure_capacity(self, n_tiles: int) -> None:
        cp = self._cp
        if n_tiles <= self._cap_tiles and self._cap_tiles:
            return
        cap = max(1, n_tiles)
        self._buf = None  # free the old buffers before allocating the new ones
        self._tstride = self.width * lay.TILE_ROWS
        with self._dev:
            self._buf = cp.empty((2, cap * self._tstride), dtype=np.float32)
            self._pos = cp.empty((2, cap * lay.TILE_ROWS), dtype=np.int32)
            self._masks = cp.zeros((2, cap), dtype=np.uint32)
            self._tile_base = cp.zeros(cap, dtype=np.int32)
        self._cap_tiles = cap
        self._b = (self._buf[0], self._buf[1])
        self._p = (self._pos[0], self._pos[1])
        table = np.array([self._buf[0].data.ptr, self._buf[1].data.ptr, self._pos[0].data.ptr,
                          self._pos[1].data.ptr, self._masks.data.ptr, self._tile_base.data.ptr,
                          self._tstride, cap],
                         dtype=np.int64)
        with self._dev, self._stream:
            self._ptrs.set(table, stream=self._stream)
        self._track_peak()

    def load_features(self, rows: SparseRows, drop_empty: bool) -> None:
        """Scatter the input rows into zeroed tiles on the device (one kernel)."""
        cp = self._cp
        if self._mod is None:
            raise SpdnnError("load_network must come before load_features")
        if self._n_layers and rows.n_cols > self.width:
            raise ValueError(f"inputs have {rows.n_cols} columns, network is {self.width} wide")
        if self._n_layers == 0 and rows.n_cols > self.width:
            self.width = rows.n_cols
            self._cap_tiles = 0  # tiles of the new width
        counts = np.diff(rows.indptr)
        rowsel = np.flatnonzero(counts > 0) if drop_empty else np.arange(rows.n_rows)
        n = len(rowsel)
        n_tiles = -(-n // lay.TILE_ROWS)
        self._ensure_capacity(n_tiles)
        self._in_width = rows.n_cols
        self._loaded_rows = n
        self._layers_run = 0
        with self._dev, self._stream:
            self._buf[0, : n_tiles * self._tstride].fill(0)
            self._masks.fill(0)
            if n:
                base = int(rows.indptr[0])
                indptr = cp.asarray(np.asarray(rows.indptr, dtype=np.int64) - base)
                small = rows.n_cols <= 65536
                itype = np.uint16 if small else np.int32
                indices = cp.asarray(np.asarray(rows.indices, dtype=itype))
                values = (cp.asarray(np.asarray(rows.values, dtype=np.float32))
                          if rows.values is not None else np.uint64(0))
                sel = cp.asarray(rowsel.astype(np.int32))
                grid = max(1, min(-(-n // 8), self.sms * 16))
                self._scatter["u16" if small else "int"](
                    (grid,), (256,),
                    (self._b[0], np.int64(self._tstride), sel, np.int32(n), indptr, indices,
                     values, self._p[0]),
                )
                self._inputs = (indptr, indices, values, sel)  # alive until the kernel ran
            state = np.zeros(ST_SIZE, dtype=np.int32)
            state[ST_ROWS], state[ST_TILES] = n, n_tiles
            self._state.set(state, stream=self._stream)
            self._stamp((1,), (32,), (self._stamps, np.int32(0)))
        self._pending = []
        self._held = 0
        self._track_peak()

    def run_layer(self, k: int, drop_dead: bool) -> None:
        """Queue layer ``k`` (and the compaction it may ask for); returns at once.

        Queued layers are launched as one captured CUDA graph (cached by the
        layer sequence; kernels take buffers from the pointer table, so a graph
        outlives reallocations) when ``finish`` or ``live_count`` needs them.
        """
        self._pending.append((k, bool(drop_dead)))
        self._layers_run = k + 1

    def _launch(self, k: int, drop_dead: bool, held: int) -> None:
        """One layer (and its compaction). ``held`` > 0: at most that many rows
        (one tile) are held, so a few blocks compute only those rows and nothing
        is compacted (dead rows stay zero, which is exact)."""
        L = self._layers[k]
        kk = np.int32(k)
        drop = drop_dead and not held
        launch, extra = L.form(held)
        args = (self._ptrs, *L.head, self._state, self._live_hist, self._stamps, kk,
                np.int32(1 if drop else 0), *extra)
        launch.kern((launch.grid,), (launch.threads,), args, shared_mem=launch.smem)
        if drop and not self._compacts_on_write(k + 1):
            self._compact((self.sms * 8,), (256,),
                          (self._ptrs, np.int32(L.n_out), self._state, self._stamps, kk))

    def _compacts_on_write(self, k: int) -> bool:
        """Whether layer ``k`` writes the compaction its predecessor may ask for
        (no compact_rows pass before it). The last layer's is left pending:
        ``finish`` reads the survivors from the mask, and a merge runs it first."""
        if k >= self._n_layers:
            return True
        return lay.compacts_on_write(self._layers[k].plan.kind)

    def _flush(self, gather: tuple | None = None) -> None:
        """Launch the queued layers: a cached graph when possible, else one by one.

        ``gather``: (grid, args, tail, copy words) of a ``gather_results`` launch
        to end the piece with (``finish``), and of the copy of its results to the
        host when that is one piece, captured into the same graph: one launch,
        and the host then only waits. ``tail`` says what the gather and the copy
        depend on beyond the arrays made with the network (the graph key).
        """
        if not self._pending and gather is None:
            return
        todo, self._pending = tuple(self._pending), []
        cache = self._graph_cache
        if todo and cache.on:
            graph = cache.get(self._piece_key(todo, self._held, gather))
            if graph is None:
                with self._dev, self._stream:
                    graph = self._capture(todo, self._held, gather)
                    # every form at once while merging: a warm-up that ends with another
                    # number of rows than the timed run then leaves nothing to capture there
                    for held in (0, *lay.ELL_ROWS) if self._merging else ():
                        if held != self._held:
                            self._capture(todo, held, gather)
            if graph is not None:
                with self._dev:  # the stream is named: no current-stream switch
                    graph.launch(stream=self._stream)
                return
        with self._dev, self._stream:
            self._run_piece(todo, self._held, gather)

    def _piece_key(self, todo: tuple, held: int, gather: tuple | None) -> tuple:
        return self._graph_cache.key(todo, held, None if gather is None else gather[2])

    def _run_piece(self, todo: tuple, held: int, gather: tuple | None) -> None:
        """Enqueue the layers of ``todo`` (then the gather and its copy) on the stream."""
        for k, drop in todo:
            self._launch(k, drop, held)
        if gather is not None:
            self._gather((gather[0],), (256,), gather[1])
            if gather[3]:
                self._results.enqueue_copy(self._stream, gather[3])

    def _capture(self, todo: tuple, held: int, gather: tuple | None = None):
        """The graph of ``todo`` (then ``gather``) with ``held`` rows, captured now."""
        return self._graph_cache.capture(self._stream, self._piece_key(todo, held, gather),
                                         lambda: self._run_piece(todo, held, gather))

    def synchronize(self) -> None:
        """Wait for everything queued on this backend's stream."""
        self._stream.synchronize()

    def flush(self) -> None:
        """Launch the queued layers (a cached graph per piece); returns at once."""
        self._flush()

    def check_pays(self, fall: float | None, held_values: int) -> bool:
        """A check here costs a sort and two copies to the host: only once rows
        stop dying fast (``compression.fall_rule``)."""
        return fall_rule(fall, held_values)

    def merge_duplicate_rows(self) -> RowGroups:
        """Merge the identical rows held now, on the device (``cuda_merge``)."""
        self._flush()
        self._merging = True
        k = self._layers_run - 1
        with self._dev, self._stream:
            # a compaction left pending by the last layer first (a no-op otherwise)
            self._compact((self.sms * 8,), (256,),
                          (self._ptrs, np.int32(self._layers[k].n_out), self._state,
                           self._stamps, np.int32(k)))
            n = int(self._state[ST_ROWS].get())  # after the queued layers
            if n == 0:
                empty = np.zeros(0, np.int64)
                return RowGroups(0, empty, empty, empty)
            groups = self._merger.merge(ptrs=self._ptrs, state=self._state, stamps=self._stamps,
                                        mask=self._masks[k & 1], compact=self._compact, n=n,
                                        width=self._layers[k].n_out, k=k)
        if groups.representatives <= lay.TILE_ROWS:  # one tile from here on: few rows
            self._held = lay.rows_bucket(max(1, groups.representatives))
        self._track_peak()
        return groups

    def live_count(self) -> int:
        """Rows alive after the last layer run (waits for the device)."""
        self._flush()
        self._stream.synchronize()
        if self._layers_run == 0:
            return int(self._state[ST_ROWS].get())
        return int(self._live_hist[self._layers_run - 1].get())

    def finish(self, want_features: bool) -> BatchResult:
        """Wait for the batch; read back the survivors' positions (and features).

        One kernel packs the counts, timestamps, positions and features into one
        array, and its copy into reused pinned memory follows in the same graph
        as the last layers, so the host launches once and waits once (fixed cost
        matters for small batches); large results are read in two steps.
        """
        n_run = self._layers_run
        width = self._layers[n_run - 1].n_out if n_run else self._in_width
        results = self._results
        allocations = results.allocations
        read = results.prepare(n_run, width, want_features, self._loaded_rows)
        blocks = max(1, min(-(-max(self._loaded_rows, read.head) // 256), self.sms * 8))
        # the graph key: the other arrays of the gather were made with the network
        tail = (blocks, n_run, width, want_features, results.copy_key(read.copy))
        self._flush(gather=(blocks, (self._ptrs, self._state, self._live_hist, self._stamps,
                                     np.int32(n_run), np.int32(width),
                                     np.int32(want_features), results.device), tail, read.copy))
        data = results.fetch(self._stream, read)
        state, live, stamps, pos, features = unpack_results(data, n_run, width, want_features,
                                                            ordered=not self._merging)
        self._compactions = int(state[ST_COMPACTIONS])
        layer_seconds = None
        if n_run and 0 not in stamps:
            layer_seconds = [(b - a) * 1e-9 for a, b in zip(stamps, stamps[1:])]
        self._inputs = None
        if results.allocations != allocations:
            self._track_peak()
        return BatchResult(pos, live, layer_seconds, features)

    def release_buffers(self) -> None:
        """Give the feature buffers and the packed results back to the device (the
        layouts stay); graphs read the buffers from the pointer table, so they stay
        valid, and the next batch allocates again."""
        self._buf = self._pos = self._masks = self._tile_base = None
        self._results.release()
        self._b = self._p = None
        self._cap_tiles = 0
        self._inputs = None
        self._cp.get_default_memory_pool().free_all_blocks()

    def max_batch_rows(self, width: int) -> int | None:
        """Rows whose two feature buffers (plus inputs) fit the free device memory."""
        cp = self._cp
        with self._dev:
            free, _total = cp.cuda.runtime.memGetInfo()
        pool = cp.get_default_memory_pool()
        held = 2 * 4 * self._cap_tiles * lay.TILE_ROWS * self.width if self._cap_tiles else 0
        avail = (free + pool.free_bytes() + held) * self._memory_fraction
        per_row = 9 * width + 64
        rows = int(avail // per_row) // lay.TILE_ROWS * lay.TILE_ROWS
        return max(lay.TILE_ROWS, rows)

    def describe(self) -> dict:
        """Device, kernels, layout size and peak device memory for the report."""
        name = self._props["name"]
        if isinstance(name, bytes):
            name = name.decode(errors="replace")
        self._track_peak()
        return {
            "backend": "cuda",
            "device": name,
            "device_id": self.device_id,
            "sms": self.sms,
            "l2_bytes": int(self._props.get("l2CacheSize", 0)),
            "variant": self.variant,
            "peak_device_bytes": self._peak,
            "compactions_last_batch": getattr(self, "_compactions", None),
            "graphs": self._graph_cache.note,
            **self._info,
        }
