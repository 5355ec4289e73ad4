"""The device half of exact compression on the CUDA backend (``cuda/spdnn_merge.cu``):
rows hashed into a table on the device, compared word by word with the first row
of their hash, the representatives compacted. The host enqueues the whole check
behind the layers and waits once; only the positions come back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from spdnn_mpi.compression import RowGroups

#: Kernels of cuda/spdnn_merge.cu, in the order they run.
MERGE_KERNELS = ("row_hashes", "hash_insert", "compare_heads", "mark_reps", "plan_reps",
                 "emit_groups")
#: Neurons one warp hashes or compares (MERGE_CHUNK in the source).
MERGE_CHUNK = 256
#: Entries of the hash table per row it may hold, rounded up to a power of two
#: (half full at most: linear probing stays short).
TABLE_LOAD = 2


class DeviceMerge:
    """Kernels and scratch arrays of the merge for one device, grown as needed."""

    def __init__(self, cp, module, sms: int) -> None:
        self._cp = cp
        self._k = {name: module.get_function(name) for name in MERGE_KERNELS}
        self._sms = sms
        self._cap = 0
        self._buf: dict[str, Any] = {}

    def _buffers(self, cap: int) -> dict[str, Any]:
        cp = self._cp
        if cap > self._cap:
            cap = max(cap, 2 * self._cap)
            log_size = max(5, (TABLE_LOAD * cap - 1).bit_length())
            self._buf = {"keys": cp.empty(cap, dtype=np.uint64),
                         "table_keys": cp.empty(1 << log_size, dtype=np.uint64),
                         "table_min": cp.empty(1 << log_size, dtype=np.int32),
                         "entry": cp.empty(cap, dtype=np.int32),
                         "owner": cp.empty(cap, dtype=np.int32),
                         "differs": cp.empty(-(-cap // 32), dtype=np.uint32),
                         "out": cp.empty(2 * cap + 2, dtype=np.int32),
                         "log_size": log_size}
            self._cap = cap
        return self._buf

    def merge(self, *, ptrs, state, stamps, mask, compact: Callable[[], None], cap: int,
              width: int, k: int) -> RowGroups:
        """Merge the rows held after 0-based layer ``k`` (at most ``cap``, ``width``
        neurons each; the device knows how many), on the current device and stream.
        ``mask``: the layer's parity of the tile masks; ``compact()`` enqueues the
        compaction that moves the representatives.
        """
        if cap == 0:
            return _no_rows()
        mk = self._k
        b = self._buffers(cap)
        b["keys"][:cap].fill(0)
        b["differs"][: -(-cap // 32)].fill(0)
        b["table_keys"].fill(0)
        b["table_min"].fill(np.iinfo(np.int32).max)
        warps = -(-cap // 32) * -(-width // MERGE_CHUNK)  # of the (tile, chunk) kernels
        grid = (max(1, min(-(-warps // 8), self._sms * 16)),)
        slots = (max(1, min(-(-cap // 256), self._sms * 8)),)
        heads = (b["table_min"], b["entry"])
        mk["row_hashes"](grid, (256,), (ptrs, state, np.int32(width), b["keys"]))
        mk["hash_insert"](slots, (256,), (state, b["keys"], np.int32(b["log_size"]),
                                          b["table_keys"], *heads))
        mk["compare_heads"](grid, (256,), (ptrs, state, np.int32(width), *heads,
                                           b["differs"]))
        mk["mark_reps"](slots, (256,), (state, *heads, b["differs"], mask, b["owner"]))
        mk["plan_reps"]((1,), (512,), (ptrs, state, stamps, np.int32(k), b["out"]))
        mk["emit_groups"](slots, (256,), (ptrs, state, np.int32(k), b["owner"], b["out"]))
        compact()
        n, reps = (int(v) for v in b["out"][:2].get())  # the one wait
        if n == 0:
            return _no_rows()
        out = b["out"][2 : 2 * n + 2 - reps].get().astype(np.int64)
        return RowGroups(n, out[:reps], out[reps:n], out[n:])


def _no_rows() -> RowGroups:
    empty = np.zeros(0, np.int64)
    return RowGroups(0, empty, empty, empty)
