"""What the CUDA backend reads back: the device state's slots and one batch's
packed results (``gather_results`` in ``cuda/spdnn_rows.cu``).

Kept apart from ``cuda.py`` (the layer loop) because it is the host's whole
side of the one copy a batch ends with: the array's layout, the reused
device and pinned host buffers, the copy, and the unpacking, which at 1000
rows is a measurable part of a small batch's timed host work. The layout and
the unpacking need no GPU and are tested on any machine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: State slots, mirrored from cuda/spdnn_common.cuh.
ST_ROWS, ST_TILES, ST_COMPACTIONS, ST_SIZE = 0, 1, 8, 16
#: The packed results are copied in one piece up to this size (else in two).
SINGLE_COPY_BYTES = 4 << 20


def results_head(n_run: int) -> int:
    """Words before the positions in ``gather_results``' array (cuda/spdnn_rows.cu)."""
    return 1 + ST_SIZE + n_run + 2 * (n_run + 1)


def unpack_results(data: np.ndarray, n_run: int, width: int, want_features: bool,
                   ordered: bool = False) -> tuple:
    """(state, live counts, stamps, positions, features) from ``gather_results``'
    int32 array, positions ascending and features in their order. ``ordered``:
    the caller knows they ascend already (no merge ran: compaction keeps the
    order), so they are not checked; at 1000 rows the check is a few us of the
    small batch's timed host work.

    Nothing returned is a view of ``data``, which may be a reused host buffer.
    """
    head = results_head(n_run)
    n_alive = int(data[0])
    state = data[1:1 + ST_SIZE].copy()
    live = data[1 + ST_SIZE:1 + ST_SIZE + n_run].tolist()
    stamps = np.ascontiguousarray(data[1 + ST_SIZE + n_run:head]).view(np.uint64)
    pos = data[head:head + n_alive]
    in_order = ordered or n_alive < 2 or not np.count_nonzero(pos[1:] <= pos[:-1])
    order = slice(None) if in_order else np.argsort(pos, kind="stable")
    features = None
    if want_features:
        flat = data[head + n_alive:head + n_alive * (1 + width)]
        features = np.array(flat.view(np.float32).reshape(n_alive, width)[order])
    return state, live, stamps.astype(np.float64), pos[order].astype(np.int64), features


class PackedResults:
    """The device array ``gather_results`` fills and its pinned host copy.

    Both are reused from batch to batch and grown, never shrunk: a captured
    graph keeps the device address, and small batches should not pay for
    allocations.
    """

    def __init__(self, cp: Any, device: Any) -> None:
        self._cp = cp
        self._device = device  # a CuPy Device (context manager): where to allocate
        self.device = None
        self._host = None

    def ensure(self, words: int) -> Any:
        """The device array, at least ``words`` long (a new one changes its address)."""
        if self.device is None or self.device.size < words:
            with self._device:
                self.device = self._cp.empty(words, dtype=np.int32)
        host_words = min(words, SINGLE_COPY_BYTES // 4)
        if self._host is None or self._host.size < host_words:
            import cupyx

            self._host = cupyx.empty_pinned(max(host_words, 4096), dtype=np.int32)
        return self.device

    def read(self, stream: Any, upper: int, head: int, per_row: int) -> np.ndarray:
        """Copy the results to the host and wait: in one piece into the pinned
        buffer up to ``SINGLE_COPY_BYTES``; else the head first, then exactly
        the survivors (``per_row`` words each) into pageable memory."""
        out, host = self.device, self._host
        if upper * 4 <= SINGLE_COPY_BYTES:
            return out[:upper].get(stream=stream, out=host[:upper])
        out[:head].get(stream=stream, out=host[:head])
        return out[:head + int(host[0]) * per_row].get(stream=stream)

    def release(self) -> None:
        """Give the device array back (the next ``ensure`` allocates again)."""
        self.device = None
