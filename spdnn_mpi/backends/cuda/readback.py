"""What the CUDA backend reads back: the device state's slots and one batch's
packed results (``gather_results`` in ``cuda/spdnn_rows.cu``), in one copy.
The layout and the unpacking need no GPU.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

#: State slots, mirrored from cuda/spdnn_common.cuh.
ST_ROWS, ST_TILES, ST_COMPACTIONS, ST_PADDED_COMPACTIONS, ST_LAYERS, ST_SIZE = 0, 1, 8, 12, 13, 16
ST_INPUT_BITS = 14
#: The packed results are copied in one piece up to this size (else in two).
SINGLE_COPY_BYTES = 4 << 20


def results_head(n_run: int) -> int:
    """Words before the positions in ``gather_results``' array (cuda/spdnn_rows.cu)."""
    return 1 + ST_SIZE + n_run + 2 * (n_run + 1)


def unpack_results(data: np.ndarray, n_run: int, width: int, want_features: bool,
                   ordered: bool = False) -> tuple:
    """(state, live counts, stamps, positions, features) from ``gather_results``'
    int32 array, positions ascending; live counts and stamps (ns) as lists of ints.
    ``ordered``: they ascend already (no merge ran), so the check is skipped.

    Nothing returned is a view of ``data``, which may be a reused host buffer.
    """
    head = results_head(n_run)
    n_alive = int(data[0])
    first = 1 + ST_SIZE
    per_row = 1 + (width if want_features else 0)
    own = data[:head + n_alive * per_row].copy()  # one copy; the parts are views of it
    state = own[1:first]
    live = own[first:first + n_run].tolist()
    stamps = own[first + n_run:head].view(np.uint64).tolist()  # exact ns (ints)
    pos = own[head:head + n_alive].astype(np.int64)
    features = None
    if want_features:
        features = own[head + n_alive:].view(np.float32).reshape(n_alive, width)
    if not ordered and n_alive > 1 and np.count_nonzero(pos[1:] <= pos[:-1]):
        order = np.argsort(pos, kind="stable")
        pos = pos[order]
        features = None if features is None else features[order]
    return state, live, stamps, pos, features


class ReadPlan(NamedTuple):
    """Where a batch's results lie in the packed array, and how they come back."""

    head: int  # words before the positions
    per_row: int  # words a survivor (its position, then its features)
    upper: int  # words at most (every loaded row alive)
    copy: int  # words copied in one piece behind the gather (0: two steps, ``read``)


class PackedResults:
    """The device array ``gather_results`` fills and its pinned host copy, reused and
    grown, never shrunk (a captured graph keeps both addresses). Up to
    ``SINGLE_COPY_BYTES`` the copy is captured behind the gather; larger results
    are read in two steps (``read``).
    """

    def __init__(self, cp: Any, device: Any) -> None:
        self._cp = cp
        self._device = device  # a CuPy Device (context manager): where to allocate
        self.device = None
        self._host = None
        self._device_ptr = self._host_ptr = 0  # their addresses (read once: ctypes is slow)
        self.allocations = 0  # device or host buffers allocated so far

    def ensure(self, words: int, host_words: int = SINGLE_COPY_BYTES // 4) -> Any:
        """The device array, at least ``words`` long (a new one changes its address),
        and a pinned host copy of its first ``host_words`` at most (what one copy reads)."""
        if self.device is None or self.device.size < words:
            with self._device:
                self.device = self._cp.empty(words, dtype=np.int32)
            self._device_ptr = self.device.data.ptr
            self.allocations += 1
        host_words = min(words, host_words, SINGLE_COPY_BYTES // 4)
        if self._host is None or self._host.size < host_words:
            # page-locked memory straight from CuPy's allocator: cupyx.empty_pinned would
            # import cupyx, whose import pulls in SciPy (0.3 s of a cached run, H100)
            words_pinned = max(host_words, 4096)
            memory = self._cp.cuda.alloc_pinned_memory(4 * words_pinned)
            self._host = np.ndarray((words_pinned,), dtype=np.int32, buffer=memory)
            self._host_ptr = self._host.ctypes.data
            self.allocations += 1
        return self.device

    def prepare(self, n_run: int, width: int, want_features: bool, n_rows: int) -> ReadPlan:
        """The plan of a batch of ``n_rows`` rows after ``n_run`` layers of ``width``
        outputs, with both buffers large enough for it."""
        head = results_head(n_run)
        per_row = 1 + (width if want_features else 0)
        upper = head + n_rows * per_row
        self.ensure(upper)
        return ReadPlan(head, per_row, upper, upper if self.fits_one_copy(upper) else 0)

    def fetch(self, stream: Any, plan: ReadPlan) -> np.ndarray:
        """The results on the host, once ``stream`` has run the gather (and the copy
        queued behind it, where the plan has one)."""
        if plan.copy:
            stream.synchronize()
            return self.copied(plan.copy)
        with self._device:
            return self.read(stream, plan.upper, plan.head, plan.per_row)

    @staticmethod
    def fits_one_copy(words: int) -> bool:
        """Whether ``words`` of results are copied in one piece behind the gather."""
        return words * 4 <= SINGLE_COPY_BYTES

    def copy_key(self, words: int) -> tuple[int, int, int, int]:
        """What a graph that ends with the gather and ``enqueue_copy(words)`` depends
        on. The allocation count tells a buffer reallocated at the same address from
        the one captured: a graph naming freed memory crashed the process (H200)."""
        return self.allocations, self._device_ptr, self._host_ptr, words

    def enqueue_copy(self, stream: Any, words: int) -> None:
        """Queue the copy of the first ``words`` results to the pinned host buffer
        on ``stream`` (capturable: no wait)."""
        runtime = self._cp.cuda.runtime
        runtime.memcpyAsync(self._host_ptr, self._device_ptr, words * 4,
                            runtime.memcpyDeviceToHost, stream.ptr)

    def copied(self, words: int) -> np.ndarray:
        """The first ``words`` results in the host buffer (the stream has been waited for)."""
        return self._host[:words]

    def read(self, stream: Any, upper: int, head: int, per_row: int) -> np.ndarray:
        """Copy the results to the host and wait: in one piece into the pinned
        buffer up to ``SINGLE_COPY_BYTES``; else the head first, then exactly
        the survivors (``per_row`` words each) into pageable memory."""
        out, host = self.device, self._host
        if self.fits_one_copy(upper):
            return out[:upper].get(stream=stream, out=host[:upper])
        out[:head].get(stream=stream, out=host[:head])
        return out[:head + int(host[0]) * per_row].get(stream=stream)

    def release(self) -> None:
        """Give the device array back (the next ``ensure`` allocates again)."""
        self.device = None
        self._device_ptr = 0
