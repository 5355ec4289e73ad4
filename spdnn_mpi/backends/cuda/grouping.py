"""The grouped kernel's layout built on the device (``cuda/spdnn_group_layout.cu``): the
groups of ``layout.group_layouts``, made by our kernels and CuPy's precompiled sort.

CuPy's array operations compile a kernel each the first time a machine runs them; the
two dozen the layout took cost a first run about 5 s (H200, 2026-12-06).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.model import Layer, stacked_indices

#: Kernels of cuda/spdnn_group_layout.cu, in the order they run.
GROUP_LAYOUT_KERNELS = ("group_keys", "group_count", "group_fill")
#: Threads of a block of group_count and group_fill (GL_WALK_THREADS in the source).
WALK_THREADS = 512


def device_group_layouts(cp: Any, module: Any, layers: Sequence[Layer],
                         sms: int) -> list[lay.GroupLayout]:
    """``layout.group_layouts`` of ``layers`` (one shape, fixed degree), on the current
    device and stream; one small copy to the host (the groups each layer opened)."""
    k = {name: module.get_function(name) for name in GROUP_LAYOUT_KERNELS}
    n, n_out, d = len(layers), layers[0].n_out, layers[0].row_degree
    rows = cp.asarray(stacked_indices(layers))  # (layers, n_out, d) uint16
    n_rows = n * n_out
    keys = cp.empty(n_rows, dtype=np.uint64)
    k["group_keys"]((max(1, min(-(-n_rows // 256), sms * 8)),), (256,),
                    (rows, np.int64(n_rows), np.int32(d // 4), keys))
    order = cp.argsort(keys.reshape(n, n_out), axis=1)  # each layer's outputs by key
    used_dev = cp.empty(n, dtype=np.int32)
    k["group_count"]((n,), (WALK_THREADS,), (rows, order, np.int32(n_out), np.int32(d),
                                              used_dev))
    used = used_dev.get().astype(np.int64)
    n_groups, first_group = lay.group_counts(used)
    total = int(n_groups.sum())
    out_ids = cp.empty((total, lay.GROUP_SLOTS), dtype=np.int32)
    out_ids.data.memset_async(0xFF, out_ids.nbytes)  # every slot -1: unused
    indices = cp.zeros((total, d), dtype=np.uint16)
    uniform = layers[0].values is None
    if uniform:
        weights = cp.asarray(np.ones(d * lay.GROUP_SLOTS, dtype=np.float32))
        vals = None
    else:
        weights = cp.zeros((total, d, lay.GROUP_SLOTS), dtype=np.float32)
        vals = cp.asarray(np.stack([np.asarray(layer.values, dtype=np.float32)
                                    for layer in layers]))
    k["group_fill"]((n,), (WALK_THREADS,),
                    (rows, order, np.int32(n_out), np.int32(d), cp.asarray(first_group),
                     out_ids, indices, vals if vals is not None else np.uint64(0),
                     weights if vals is not None else np.uint64(0)))
    return lay.split_group_layouts(used, indices, out_ids, weights, n_out)
