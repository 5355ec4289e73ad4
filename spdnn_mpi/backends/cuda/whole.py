"""Every layer of a small network in one launch (``cuda/spdnn_whole.cu``), for small
batches: a block keeps 8 rows in shared memory from the first layer to the last, where
one kernel a layer pays a launch, a plan and a trip through global memory for each
layer and leaves most SMs idle on a few tiles of rows.

It runs a batch when the whole network is one piece of the layer loop, no merge came
before, every layer is on the CSR4 kernels (the pruned models' layers), two rows of 8
of the widest layer fit a block's shared memory, the network has at most ``MAX_EDGES``
weights and the batch is one wave (a block for each 8 rows). The outputs are the same
bits as one layer a launch.

Where the rule comes from (H100, 2026-12-07, the shipped MNIST models, ``run_inference``
medians, one process): at 1000 rows (125 blocks) one launch took 0.82x the layer-a-
launch time with 18.6k weights (99 %), 0.84x with 37k (98 %), 0.91x with 93k (95 %)
and 1.03x with 186k (90 %); at 4096 rows (4 items a block, before the outputs were
balanced over the warps) 1.13-1.50x. A block of 512 threads holds its SM alone, so one
launch wins only while the work is small enough that the launches and trips through
global memory it saves outweigh the warps it leaves unused.

Host logic: which networks qualify, the per-layer argument table, the launch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.launch import LayerLaunch, device_pointer

#: ``WholeLayer`` of cuda/spdnn_whole.cu, field for field (offsets and size included).
WHOLE_LAYER_DTYPE = np.dtype({
    "names": ["spans", "idx", "vals", "bias_v", "n_in", "n_out", "scale", "bias_s",
              "floor", "clip"],
    "formats": [np.uint64, np.uint64, np.uint64, np.uint64, np.int32, np.int32, np.float32,
                np.float32, np.float32, np.float32],
    "offsets": [0, 8, 16, 24, 32, 36, 40, 44, 48, 52],
    "itemsize": 56,
})
#: Rows a block holds (its template argument) and items a 32-row tile makes.
ROWS = 8
KERNEL = f"whole_network<{ROWS}>"
#: Threads a block (the kernel's launch bounds).
THREADS = 512
#: Outputs a warp takes at a time (two lanes an output) and the id of a slot that
#: holds none (past every layer's outputs: ``smem_bytes`` bounds the widths).
STEP = 16
EMPTY = 0xFFFF
#: Most weights (all layers) of a network that runs so: between the 95 % model's 93k,
#: where one launch won, and the 90 % model's 186k, where it lost.
MAX_EDGES = 1 << 17


def smem_bytes(width: int) -> int:
    """Shared memory a block needs for layers at most ``width`` wide: two buffers."""
    return 2 * width * ROWS * 4


def qualifies(plans: Sequence[lay.LayerPlan], width: int, edges: int,
              smem_limit: int) -> bool:
    """Whether a network of these layer plans, ``width`` wide at most and of ``edges``
    weights, runs so."""
    return (bool(plans) and all(p.kind.startswith("csr4") for p in plans)
            and edges <= MAX_EDGES and smem_bytes(width) <= smem_limit)


def balanced_spans(spans: np.ndarray, warps: int) -> np.ndarray:
    """``spans`` (output j: first entry, degree) in the slots a block's ``warps``
    warps take them from, ``(it * warps + w) * STEP + p``: its ``p``-th output at
    iteration ``it`` of warp ``w``; each slot ``(first entry, degree | j << 16)``,
    ``EMPTY`` for none.

    A layer lasts as long as its slowest warp (a barrier follows), and a warp's
    step as long as its heaviest output, so outputs sorted by degree go ``STEP``
    to a step and each step to the warp with the fewest chunks so far (every warp
    takes as many steps): the 99 % model's second layer waits for 34 chunks of 8
    entries, its heaviest output alone, instead of 53 in output order."""
    n_out = len(spans)
    deg = np.asarray(spans[:, 1], dtype=np.int64)
    if n_out > EMPTY or (n_out and int(deg.max()) > EMPTY):
        raise ValueError(f"{n_out} outputs or a degree over {EMPTY}: no 16-bit slot ids")
    order = np.argsort(-deg, kind="stable")
    n_steps = -(-n_out // STEP)
    iters = -(-n_steps // warps)
    out = np.zeros((iters * warps * STEP, 2), dtype=np.uint32)
    out[:, 1] = EMPTY << 16
    load, taken = np.zeros(warps, dtype=np.int64), np.zeros(warps, dtype=np.int64)
    for step in range(n_steps):
        ids = order[step * STEP:(step + 1) * STEP]
        free = np.flatnonzero(taken < iters)
        w = free[np.argmin(load[free])]
        slot = (taken[w] * warps + w) * STEP
        out[slot:slot + len(ids), 0] = spans[ids, 0]
        out[slot:slot + len(ids), 1] = deg[ids] | (ids.astype(np.int64) << 16)
        load[w] += -(-deg[ids[0]] // 8)  # the step's heaviest output: sorted first
        taken[w] += 1
    return out.view(np.int32)


class WholeNetwork:
    """The network's argument table, its kernel and the rule for when it runs."""

    def __init__(self, cp: Any, module: Any, entries: Sequence[LayerLaunch], width: int,
                 n_sms: int, blocks_per_sm: Callable[[Any, int, int], int]) -> None:
        table = np.zeros(len(entries), dtype=WHOLE_LAYER_DTYPE)
        self._slots = []  # each layer's balanced_spans on the device (the table points)
        for k, entry in enumerate(entries):
            spans, idx, vals = entry.extra
            n_in, n_out, scale, bias_s, bias_v, floor, clip = entry.head
            has_vals = int(vals.size) > 1  # one float: the uniform weight is scale
            self._slots.append(cp.asarray(balanced_spans(spans.get(), THREADS // 32)))
            table[k] = (device_pointer(self._slots[-1]), device_pointer(idx),
                        device_pointer(vals) if has_vals else 0, device_pointer(bias_v),
                        n_in, n_out, scale, bias_s, floor, clip)
        self.n_layers = len(entries)
        self.table = cp.asarray(table.view(np.uint8))
        self._counts = cp.zeros(max(1, self.n_layers), dtype=np.int32)  # zero between runs
        self._width = width
        self._smem = smem_bytes(width)
        self._kernel = module.get_function(KERNEL)
        if self._smem > 48 * 1024 and self._kernel.max_dynamic_shared_size_bytes < self._smem:
            self._kernel.max_dynamic_shared_size_bytes = self._smem
        self._blocks = n_sms * blocks_per_sm(self._kernel, THREADS, self._smem)

    def grid(self, todo: Sequence[tuple[int, bool]], held: int, rows: int) -> int:
        """Blocks of the launch that runs ``todo`` (every layer, from a fresh batch of
        ``rows`` rows, none merged: ``held`` 0), or 0 where the piece runs a layer a
        launch (also where the rows need more than one wave of blocks)."""
        items = -(-rows // ROWS)
        if held or items > self._blocks or len(todo) != self.n_layers or todo[0][0] != 0:
            return 0
        return max(1, items)

    @property
    def max_rows(self) -> int:
        """Most rows a batch may load to run so: one wave of blocks."""
        return ROWS * self._blocks

    def launch(self, grid: int, ptrs: Any, state: Any, live_hist: Any, stamps: Any) -> None:
        """Enqueue every layer over the rows loaded, ``grid`` blocks (``grid``)."""
        self._kernel((grid,), (THREADS,),
                     (ptrs, self.table, np.int32(self.n_layers), np.int32(self._width), state,
                      live_hist, stamps, self._counts), shared_mem=self._smem)
