"""The batch's side of the CUDA backend's device memory: two buffers of 32-row
feature tiles (``cuda/spdnn_common.cuh``), the pointer table the kernels read them
through (so a captured graph outlives a reallocation), and the layer loop's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.readback import ST_INPUT_BITS, ST_LAYERS, ST_ROWS, ST_SIZE, ST_TILES
from spdnn_mpi.model import SparseRows

#: Pointer table: buf0, buf1, pos0, pos1, masks, tile_base, tstride, max_tiles
#: (the P_* slots of cuda/spdnn_common.cuh).
P_SIZE = 8


class FeatureBuffers:
    """Feature tiles, pointer table and device state of one backend."""

    def __init__(self, cp: Any, device: Any, stream: Any, sms: int,
                 track_peak: Callable[[], None]) -> None:
        self._cp = cp
        self._device = device  # a CuPy Device (context manager)
        self._stream = stream
        self._sms = sms
        self._track_peak = track_peak  # called after allocating
        self.width = 0  # neurons a tile row holds (the network's widest layer)
        self.cap_tiles = 0  # tiles the buffers hold (0: not allocated)
        self.tstride = 0  # floats a tile
        self.buf = self.pos = self.masks = self.tile_base = None
        self.ptrs = self.state = self.live_hist = self.stamps = None
        self.in_width = 0  # columns of the batch's inputs
        self.loaded_rows = 0  # rows of the batch (empty ones dropped if asked)
        self.input_bits = False  # the batch's inputs went in as bits (scatter_bits)
        self._scatter: dict[str, Any] = {}  # scatter_rows by index type
        self._scatter_bits: dict[str, Any] = {}  # scatter_bits by index type (none: not used)
        self._stamp = None  # the stamp kernel (layer 0's timestamp)
        self._inputs: tuple | None = None  # the batch's rows on the device, until the next load

    def attach(self, module: Any, n_layers: int, width: int, input_bits: bool) -> None:
        """Take the kernels of ``module`` and size the state for ``n_layers`` layers at
        most ``width`` wide; the feature tiles are allocated by the next ``load``.
        ``input_bits``: the first layer reads binary inputs as bits (``load``)."""
        cp = self._cp
        self._scatter = {it: module.get_function(f"scatter_rows<{it}>") for it in ("u16", "int")}
        self._scatter_bits = ({it: module.get_function(f"scatter_bits<{it}>")
                               for it in ("u16", "int")} if input_bits else {})
        self._stamp = module.get_function("stamp")
        self.width = width
        with self._device:
            self.live_hist = cp.zeros(max(1, n_layers), dtype=np.int32)
            self.stamps = cp.zeros(n_layers + 1, dtype=np.uint64)
            self.state = cp.zeros(ST_SIZE, dtype=np.int32)
            self.ptrs = cp.zeros(P_SIZE, dtype=np.int64)
        self.cap_tiles = 0

    def widen(self, width: int) -> None:
        """Hold rows of ``width`` neurons (no layers: the inputs are the output)."""
        if width > self.width:
            self.width = width
            self.cap_tiles = 0  # tiles of the new width

    def ensure_capacity(self, n_tiles: int) -> None:
        """Buffers of at least ``n_tiles`` tiles, and the pointer table naming them."""
        cp = self._cp
        if n_tiles <= self.cap_tiles and self.cap_tiles:
            return
        cap = max(1, n_tiles)
        self.buf = None  # free the old buffers before allocating the new ones
        self.tstride = self.width * lay.TILE_ROWS
        with self._device:
            self.buf = cp.empty((2, cap * self.tstride), dtype=np.float32)
            self.pos = cp.empty((2, cap * lay.TILE_ROWS), dtype=np.int32)
            self.masks = cp.zeros((2, cap), dtype=np.uint32)
            # each tile's first compacted slot: exact, then 8-aligned (tile_slot)
            self.tile_base = cp.zeros(2 * cap, dtype=np.int32)
        self.cap_tiles = cap
        table = np.array([self.buf[0].data.ptr, self.buf[1].data.ptr, self.pos[0].data.ptr,
                          self.pos[1].data.ptr, self.masks.data.ptr, self.tile_base.data.ptr,
                          self.tstride, cap], dtype=np.int64)
        with self._device, self._stream:
            self.ptrs.set(table, stream=self._stream)
        self._track_peak()

    def load(self, rows: SparseRows, drop_empty: bool, n_layers: int) -> None:
        """Scatter ``rows`` (empty ones dropped if ``drop_empty``) into zeroed tiles
        (one kernel), reset the state to them and to a network of ``n_layers`` layers
        (compactions are weighed by the layers left), and stamp the start; asynchronous.
        Binary rows, where the first layer reads bits (``attach``), go in as one bit a
        row of a word a neuron (``scatter_bits``): a 32nd of the bytes that layer
        reads."""
        cp = self._cp
        # the last batch's rows go here, not when it finished: freeing four arrays is
        # a few microseconds of a small batch's timed part
        self._inputs = None
        counts = np.diff(rows.indptr)
        rowsel = np.flatnonzero(counts > 0) if drop_empty else np.arange(rows.n_rows)
        n = len(rowsel)
        n_tiles = -(-n // lay.TILE_ROWS)
        self.ensure_capacity(n_tiles)
        self.in_width = rows.n_cols
        self.loaded_rows = n
        bits = self.input_bits = bool(self._scatter_bits) and rows.values is None
        with self._device, self._stream:
            # whole tiles (a memset; zeroing only the words, a strided fill, would
            # compile a CuPy kernel on a machine's first run)
            self.buf[0, : n_tiles * self.tstride].fill(0)
            self.masks.fill(0)
            if n:
                base = int(rows.indptr[0])
                indptr = cp.asarray(np.asarray(rows.indptr, dtype=np.int64) - base)
                small = rows.n_cols <= 65536
                itype = np.uint16 if small else np.int32
                indices = cp.asarray(np.asarray(rows.indices, dtype=itype))
                values = (cp.asarray(np.asarray(rows.values, dtype=np.float32))
                          if rows.values is not None else np.uint64(0))
                sel = cp.asarray(rowsel.astype(np.int32))
                grid = max(1, min(-(-n // 8), self._sms * 16))
                itname = "u16" if small else "int"
                rows_args = (self.buf[0], np.int64(self.tstride), sel, np.int32(n), indptr,
                             indices)
                if bits:  # no values: every entry is 1
                    self._scatter_bits[itname]((grid,), (256,), (*rows_args, self.pos[0]))
                else:
                    self._scatter[itname]((grid,), (256,), (*rows_args, values, self.pos[0]))
                self._inputs = (indptr, indices, values, sel)  # alive until the kernel ran
            state = np.zeros(ST_SIZE, dtype=np.int32)
            state[ST_ROWS], state[ST_TILES], state[ST_LAYERS] = n, n_tiles, n_layers
            state[ST_INPUT_BITS] = bits
            self.state.set(state, stream=self._stream)
            self._stamp((1,), (32,), (self.stamps, np.int32(0)))
        self._track_peak()

    def held_bytes(self) -> int:
        """Device bytes of the two feature buffers now allocated."""
        return 2 * 4 * self.cap_tiles * lay.TILE_ROWS * self.width if self.cap_tiles else 0

    def release(self) -> None:
        """Give the feature buffers back (the pointer table and the state stay)."""
        self.buf = self.pos = self.masks = self.tile_base = None
        self.cap_tiles = 0
        self._inputs = None
