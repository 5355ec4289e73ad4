"""The device half of exact compression on the CUDA backend (``cuda/spdnn_merge.cu``):
rows hashed into a table on the device, compared word by word with the first row
of their hash, the representatives compacted. The host enqueues the whole check
behind the layers, with the copy of its positions to pinned host memory, and
waits once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from spdnn_mpi.backends.cuda.readback import PackedResults
from spdnn_mpi.compression import RowGroups

#: Kernels of cuda/spdnn_merge.cu, in the order they run.
MERGE_KERNELS = ("merge_clear", "row_hashes", "hash_insert", "compare_heads", "mark_reps",
                 "plan_reps", "emit_groups")
#: Neurons one warp hashes or compares (MERGE_CHUNK in the source).
MERGE_CHUNK = 64
#: Words of the result copied to the host behind the check, before the one wait: a
#: check's positions up to about 8000 held rows. The result's size is known on the
#: device only; a larger one's rest is read after the wait (copying a whole batch's
#: bound, 480 KB at 60000 rows, cost every check its transfer).
AHEAD_WORDS = 1 << 14
#: Entries of the hash table per row it may hold, rounded up to a power of two
#: (half full at most: linear probing stays short).
TABLE_LOAD = 2


class DeviceMerge:
    """Kernels and scratch arrays of the merge for one device, grown as needed."""

    def __init__(self, cp, device, module, sms: int) -> None:
        self._cp = cp
        self._k = {name: module.get_function(name) for name in MERGE_KERNELS}
        self._sms = sms
        self._cap = 0
        self._buf: dict[str, Any] = {}
        # the result (a header and three positions' lists) and its pinned host copy,
        # up to AHEAD_WORDS queued behind the check; a larger result's rest is read after the wait
        self._out = PackedResults(cp, device)

    def _buffers(self, cap: int) -> dict[str, Any]:
        cp = self._cp
        if cap > self._cap:
            cap = max(cap, 2 * self._cap)
            table = 1 << max(5, (TABLE_LOAD * cap - 1).bit_length())
            self._buf = {"keys": cp.empty(cap, dtype=np.uint64),
                         "table_keys": cp.empty(table, dtype=np.uint64),
                         "table_min": cp.empty(table, dtype=np.int32),
                         "entry": cp.empty(cap, dtype=np.int32),
                         "owner": cp.empty(cap, dtype=np.int32),
                         "differs": cp.empty(-(-cap // 32), dtype=np.uint32),
                         "out": self._out.ensure(2 * cap + 2, AHEAD_WORDS)}
            self._cap = cap
        return self._buf

    def merge(self, *, ptrs, state, stamps, mask, compact: Callable[[], None], cap: int,
              width: int, k: int, stream) -> RowGroups:
        """Merge the rows held after 0-based layer ``k`` (at most ``cap``, ``width``
        neurons each; the device knows how many), on the current device and
        ``stream``. ``mask``: the layer's parity of the tile masks; ``compact()``
        enqueues the compaction that moves the representatives.
        """
        if cap == 0:
            return _no_rows()
        mk = self._k
        b = self._buffers(cap)
        table = b["table_keys"].size
        warps = -(-cap // 32) * -(-width // MERGE_CHUNK)  # of the (tile, chunk) kernels
        grid = (max(1, min(-(-warps // 8), self._sms * 16)),)
        slots = (max(1, min(-(-cap // 256), self._sms * 8)),)
        heads = (b["table_min"], b["entry"])
        mk["merge_clear"]((max(1, min(-(-table // 256), self._sms * 8)),), (256,),
                          (np.int32(self._cap), np.int32(table), b["keys"], b["differs"],
                           b["table_keys"], b["table_min"]))
        mk["row_hashes"](grid, (256,), (ptrs, state, np.int32(width), b["keys"]))
        mk["hash_insert"](slots, (256,), (state, b["keys"], np.int32(table.bit_length() - 1),
                                          b["table_keys"], *heads))
        mk["compare_heads"](grid, (256,), (ptrs, state, np.int32(width), *heads,
                                           b["differs"]))
        mk["mark_reps"](slots, (256,), (state, *heads, b["differs"], mask, b["owner"]))
        mk["plan_reps"]((1,), (512,), (ptrs, state, stamps, np.int32(k), b["out"]))
        mk["emit_groups"](slots, (256,), (ptrs, state, np.int32(k), b["owner"], b["out"]))
        compact()
        copied = min(2 * cap + 2, AHEAD_WORDS)
        self._out.enqueue_copy(stream, copied)
        stream.synchronize()  # the one wait
        host = self._out.copied(copied)
        n, reps = int(host[0]), int(host[1])
        if n == 0:
            return _no_rows()
        words = 2 * n + 2 - reps
        out = host[2:min(words, copied)].astype(np.int64)
        if words > copied:  # more than the copy ahead held
            out = np.concatenate([out, b["out"][copied:words].get().astype(np.int64)])
        return RowGroups(n, out[:reps], out[reps:n], out[n:])


def _no_rows() -> RowGroups:
    empty = np.zeros(0, np.int64)
    return RowGroups(0, empty, empty, empty)
