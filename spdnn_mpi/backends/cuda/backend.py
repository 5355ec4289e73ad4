"""CUDA backend: one fused kernel per layer, dead rows dropped on the device.

The host enqueues the layers and waits only in ``finish``: live counts, the buffer
in use and per-layer timestamps stay on the device (docs/design.md). CuPy is
imported lazily; building a ``CudaBackend`` without it raises ``SpdnnError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from spdnn_mpi.backends.base import Backend, BatchResult
from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.compile import (
    import_cupy,
    module_and_whether_compiled,
    reads_input_bits,
)
from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.backends.cuda.features import FeatureBuffers
from spdnn_mpi.backends.cuda.layer_queue import LayerQueue
from spdnn_mpi.backends.cuda.merge import DeviceMerge
from spdnn_mpi.backends.cuda.network import DeviceNetwork, build_network, network_kernels
from spdnn_mpi.backends.cuda.readback import (
    ST_COMPACTIONS,
    ST_PADDED_COMPACTIONS,
    ST_ROWS,
    PackedResults,
    unpack_results,
)
from spdnn_mpi.check_policy import CheckCosts
from spdnn_mpi.compression import RowGroups
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Layer, SparseRows


class CudaBackend(Backend):
    """The engine's backend on one NVIDIA GPU (``backends.base.Backend``)."""

    name = "cuda"
    tile_rows = lay.TILE_ROWS
    #: a look waits for the device and cuts the graph: a 3-layer MNIST model at 1000
    #: images took 0.90 ms with looks after layers 1 and 2, 0.22 ms without (H200)
    check_min_layers_left = 8
    #: a look stalls the device for a wait and a relaunch; a check's fixed part is
    #: its launches (seven kernels) and the copy of the groups (a prior: with
    #: the device idle meanwhile, 0.26-0.43 ms a check on an H100 at N = 1024-4096,
    #: which the policy measures after the first); a layer on one tile of rows still
    #: costs its launch and its weights (converged layers one a launch: 7.2-8.0 us,
    #: H200; many a launch: 2.8-5.6 us, H100, not yet re-weighed here)
    check_costs = CheckCosts(look=20e-6, check=150e-6, layer=6e-6)
    #: the whole batch: a graph's last gather is sized by the rows, so a smaller
    #: warm-up left the capture in the first timed run (0.173 against 0.027 s, H100)
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
        self._cp = cp
        self.device_id = int(device)
        self._dev = cp.cuda.Device(self.device_id)
        self._props = cp.cuda.runtime.getDeviceProperties(self.device_id)
        self.sms = int(self._props["multiProcessorCount"])
        self.variant = variant
        self.config = config or KernelConfig()
        self._memory_fraction = memory_fraction
        with self._dev:
            self._stream = cp.cuda.Stream(non_blocking=True)
        self._peak = 0  # most device memory the pool held
        self._results = PackedResults(cp, self._dev)  # gather_results' array, its host copy
        self._buffers = FeatureBuffers(cp, self._dev, self._stream, self.sms, self._track_peak)
        self._queue = LayerQueue(self._buffers, self._results, self._dev, self._stream,
                                 self.sms, graphs)
        self._network: DeviceNetwork | None = None
        self._merger: DeviceMerge | None = None
        self._layers_run = 0
        self._compactions: int | None = None  # of the last batch
        self._padded_compactions: int | None = None  # of those, to 8-aligned slots
        self._prepared = (0.0, False)  # prepare_kernels: (seconds, whether NVRTC ran)

    def _track_peak(self) -> None:
        pool = self._cp.get_default_memory_pool()
        self._peak = max(self._peak, int(pool.total_bytes()))

    # -- network -------------------------------------------------------------
    def prepare_kernels(self, layers: Sequence[Layer]) -> None:
        """Compile the kernels these layers need, or load them from the disk cache."""
        names = network_kernels(self._props, self.variant, layers)
        t0 = time.perf_counter()
        with self._dev:
            _module, compiled = module_and_whether_compiled(self.device_id, names, self.config)
        self._prepared = (time.perf_counter() - t0, compiled)

    def load_network(self, layers: Sequence[Layer], progress=None) -> None:
        """Upload each layer's kernel layout (``progress(layers done)`` after each); compile."""
        net = build_network(self._cp, self._dev, self._stream, self.device_id, self._props,
                            self.variant, self.config, layers, progress)
        self._network = net
        self._merger = DeviceMerge(self._cp, self._dev, net.module, self.sms)
        self._buffers.attach(net.module, len(net.layers), net.width,
                             reads_input_bits([entry.plan for entry in net.layers]))
        self._queue.attach(net.module, net.layers, net.held, net.whole)
        self._track_peak()

    # -- batch ---------------------------------------------------------------
    def load_features(self, rows: SparseRows, drop_empty: bool) -> None:
        """Scatter the input rows into zeroed tiles on the device (one kernel)."""
        if self._network is None:
            raise SpdnnError("load_network must come before load_features")
        width = self._network.width
        if self._network.layers and rows.n_cols > width:
            raise ValueError(f"inputs have {rows.n_cols} columns, network is {width} wide")
        self._buffers.widen(rows.n_cols)  # no layers: the network is as wide as its inputs
        self._buffers.load(rows, drop_empty, len(self._network.layers))
        self._queue.start_batch()
        self._layers_run = 0

    def run_layer(self, k: int, drop_dead: bool) -> None:
        """Queue layer ``k`` (and the compaction it may ask for); returns at once. The
        queue runs as one captured CUDA graph when ``finish`` or ``live_count`` needs it."""
        self._queue.add(k, drop_dead)
        self._layers_run = k + 1

    def synchronize(self) -> None:
        """Wait for everything queued on this backend's stream."""
        self._stream.synchronize()

    def flush(self) -> None:
        """Launch the queued layers (a cached graph per piece); returns at once."""
        self._queue.flush()

    def merge_duplicate_rows(self) -> RowGroups:
        """Merge the identical rows held now, on the device (``merge``). At most the
        batch's tiles are held (a padded compaction's slots included)."""
        queue, b = self._queue, self._buffers
        queue.flush()
        queue.merging = True
        k = self._layers_run - 1
        with self._dev, self._stream:
            queue.compact(k)  # a compaction left pending by the last layer (a no-op otherwise)
            groups = self._merger.merge(ptrs=b.ptrs, state=b.state, stamps=b.stamps,
                                        mask=b.masks[k & 1], compact=lambda: queue.compact(k),
                                        cap=lay.TILE_ROWS * -(-b.loaded_rows // lay.TILE_ROWS),
                                        width=queue.layers[k].n_out, k=k,
                                        stream=self._stream)
        if groups.rows_before == 0:
            return groups
        if groups.representatives <= lay.TILE_ROWS:  # one tile from here on: few rows
            queue.held = lay.rows_bucket(max(1, groups.representatives))
        self._track_peak()
        return groups

    def one_time_seconds(self) -> float:
        """Host seconds spent capturing CUDA graphs, the device idle meanwhile."""
        return self._queue.capture_seconds

    def live_count(self) -> int:
        """Rows alive after the last layer run (waits for the device)."""
        self._queue.flush()
        self._stream.synchronize()
        if self._layers_run == 0:
            return int(self._buffers.state[ST_ROWS].get())
        return int(self._buffers.live_hist[self._layers_run - 1].get())

    def finish(self, want_features: bool,
               meanwhile: Callable[[], None] | None = None) -> BatchResult:
        """Wait for the batch (running ``meanwhile`` once it is launched); read back the
        survivors' positions (and features) in one packed copy that follows the last
        layers in their graph (``readback``)."""
        n_run = self._layers_run
        width = self._queue.layers[n_run - 1].n_out if n_run else self._buffers.in_width
        allocations = self._results.allocations
        data = self._queue.finish(n_run, width, want_features, meanwhile)
        state, live, stamps, pos, features = unpack_results(
            data, n_run, width, want_features, ordered=not self._queue.merging)
        self._compactions = int(state[ST_COMPACTIONS])
        self._padded_compactions = int(state[ST_PADDED_COMPACTIONS])
        layer_seconds = None
        if n_run and 0 not in stamps:
            layer_seconds = [(b - a) * 1e-9 for a, b in zip(stamps, stamps[1:])]
        if self._results.allocations != allocations:
            self._track_peak()
        return BatchResult(pos, live, layer_seconds, features)

    # -- memory and report ---------------------------------------------------
    def release_buffers(self) -> None:
        """Give the feature buffers and the packed results back to the device (the
        layouts stay; graphs read buffers from the pointer table, so they stay valid)."""
        self._buffers.release()
        self._results.release()
        self._cp.get_default_memory_pool().free_all_blocks()

    def max_batch_rows(self, width: int) -> int | None:
        """Rows whose two feature buffers (plus inputs) fit the free device memory."""
        cp = self._cp
        with self._dev:
            free, _total = cp.cuda.runtime.memGetInfo()
        pool = cp.get_default_memory_pool()
        avail = (free + pool.free_bytes() + self._buffers.held_bytes()) * self._memory_fraction
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
            "compactions_last_batch": self._compactions,
            "padded_compactions_last_batch": self._padded_compactions,
            # the last batch's binary inputs went in as bits, read so by the first layer
            "inputs_as_bits": self._buffers.input_bits,
            "graphs": self._queue.graphs.note,
            **self._kernel_info(),
        }

    def _kernel_info(self) -> dict:
        """The network's layout facts, its kernels' compile time and whether NVRTC ran."""
        info = dict(self._network.info) if self._network is not None else {}
        seconds, compiled = self._prepared
        info["compile_seconds"] = round(info.get("compile_seconds", 0.0) + seconds, 4)
        info["kernels_compiled"] = bool(info.get("kernels_compiled")) or compiled
        return info
