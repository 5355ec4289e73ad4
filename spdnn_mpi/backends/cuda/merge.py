"""The device half of exact compression on the CUDA backend (``cuda/spdnn_merge.cu``):
rows hashed, sorted, compared word by word with the first of their run, the
representatives compacted; only their positions come to the host, in one copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from spdnn_mpi.compression import RowGroups

#: Kernels of cuda/spdnn_merge.cu, in the order they run.
MERGE_KERNELS = ("row_hashes", "group_heads", "compare_heads", "mark_reps", "plan_reps",
                 "emit_groups")
#: Neurons one warp hashes or compares (MERGE_CHUNK in the source).
MERGE_CHUNK = 256


class DeviceMerge:
    """Kernels and scratch arrays of the merge for one device, grown as needed."""

    def __init__(self, cp, module, sms: int) -> None:
        self._cp = cp
        self._k = {name: module.get_function(name) for name in MERGE_KERNELS}
        self._sms = sms
        self._cap = 0
        self._buf: dict[str, Any] = {}

    def _buffers(self, n: int) -> dict[str, Any]:
        cp = self._cp
        if n > self._cap:
            cap = max(n, 2 * self._cap)
            self._buf = {"keys": cp.empty(cap, dtype=np.uint64),
                         "head": cp.empty(cap, dtype=np.int32),
                         "owner": cp.empty(cap, dtype=np.int32),
                         "differs": cp.empty(-(-cap // 32), dtype=np.uint32),
                         "out": cp.empty(2 * cap + 1, dtype=np.int32)}
            self._cap = cap
        return self._buf

    def merge(self, *, ptrs, state, stamps, mask, compact: Callable[[], None], n: int,
              width: int, k: int) -> RowGroups:
        """Merge the ``n`` rows held after 0-based layer ``k`` (``width`` neurons each),
        on the current device and stream. ``mask``: the layer's parity of the tile
        masks; ``compact()`` enqueues the compaction that moves the representatives.
        """
        cp, mk = self._cp, self._k
        b = self._buffers(n)
        keys = b["keys"][:n]
        keys.fill(0)
        b["differs"][: -(-n // 32)].fill(0)
        warps = -(-n // 32) * -(-width // MERGE_CHUNK)  # of the (tile, chunk) kernels
        grid = (max(1, min(-(-warps // 8), self._sms * 16)),)
        slots = (max(1, min(-(-n // 256), self._sms * 8)),)
        mk["row_hashes"](grid, (256,), (ptrs, state, np.int32(width), keys))
        order = cp.argsort(keys)  # stable: a run's first slot is its smallest
        mk["group_heads"](slots, (256,), (keys, order, np.int32(n), b["head"]))
        mk["compare_heads"](grid, (256,), (ptrs, state, np.int32(width), b["head"],
                                           b["differs"]))
        mk["mark_reps"](slots, (256,), (state, b["head"], b["differs"], mask, b["owner"]))
        mk["plan_reps"]((1,), (512,), (ptrs, state, stamps, np.int32(k), b["out"]))
        mk["emit_groups"](slots, (256,), (ptrs, state, np.int32(k), b["owner"], b["out"]))
        compact()
        out = b["out"][: 2 * n + 1].get().astype(np.int64)
        reps = int(out[0])
        return RowGroups(n, out[1 : 1 + reps], out[1 + reps : 1 + n],
                         out[1 + n : 1 + 2 * n - reps])
