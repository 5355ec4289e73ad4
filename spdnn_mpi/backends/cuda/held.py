"""Converged layers in one launch (``cuda/spdnn_held.cu``): once the compressed rows
fit one tile, a run of consecutive uniform grouped layers of one degree is one
``layers_held_sum`` launch over one cluster of blocks, where each layer alone cost
its launch and the drain between kernels (7.2-8.0 us a converged layer, H200).

Host logic: which layers qualify, the per-layer argument table, the runs of a piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.backends.cuda.launch import LayerLaunch

#: ``HeldLayer`` of cuda/spdnn_held.cu, field for field (offsets and size included).
HELD_LAYER_DTYPE = np.dtype({
    "names": ["gidx", "gout", "bias_v", "n_groups", "n_out", "scale", "bias_s", "floor",
              "clip"],
    "formats": [np.uint64, np.uint64, np.uint64, np.int32, np.int32, np.float32,
                np.float32, np.float32, np.float32],
    "offsets": [0, 8, 16, 24, 28, 32, 36, 40, 44],
    "itemsize": 48,
})

#: The shared-sum grouped kernel's name, up to its degree.
_SUM_KERNEL = "layer_group_sum<"
#: Widest layer (inputs or outputs) run in one launch. One cluster's 8 SMs carry every
#: layer of a run: up to N = 16384 that beats a launch a layer over the whole card
#: (5.6 against 8.5 us a converged layer, H100), at N = 65536 it does not (41.3
#: against 9.7 us; compressed 65536 x 1920 1212.5 against 1737.5 TE/s, H100).
MAX_WIDTH = 16384


def supported(props: dict) -> bool:
    """Whether the device launches the kernel's clusters (compute capability 9.0 on)."""
    return int(props.get("major", 0)) >= 9


def kernel_name(degree: int) -> str:
    """The instantiation for layers of ``degree`` inputs an output (any rows held:
    one a degree, since NVRTC's time grows with each)."""
    return f"layers_held_sum<{degree}>"


def runs_held(plan: lay.LayerPlan, n_in: int, n_out: int) -> bool:
    """Whether a layer of this plan and shape runs in the one-launch kernel once rows
    are held: a shared-sum grouped layer at most ``MAX_WIDTH`` wide."""
    return plan.kernel.startswith(_SUM_KERNEL) and max(n_in, n_out) <= MAX_WIDTH


def kernel_names(plans: Sequence[lay.LayerPlan], layers: Sequence) -> set[str]:
    """Every instantiation the layers (``plans``, one a layer) may run in."""
    return {kernel_name(p.degree) for p, layer in zip(plans, layers)
            if runs_held(p, layer.n_in, layer.n_out)}


def _degree(entry: LayerLaunch) -> int:
    """The layer's degree if it runs in the one-launch kernel, else 0."""
    n_in, n_out = entry.head[:2]
    return entry.plan.degree if runs_held(entry.plan, n_in, n_out) else 0


def _pointer(array: Any) -> int:
    return 0 if isinstance(array, np.integer) else int(array.data.ptr)


class HeldLayers:
    """The network's argument table and kernels; the runs of a piece to launch as one."""

    def __init__(self, cp: Any, module: Any, entries: Sequence[LayerLaunch],
                 config: KernelConfig) -> None:
        self._degrees = [_degree(e) for e in entries]
        self._groups = [0] * len(entries)  # groups of each shared-sum layer
        table = np.zeros(len(entries), dtype=HELD_LAYER_DTYPE)
        for k, (entry, degree) in enumerate(zip(entries, self._degrees)):
            if not degree:
                continue
            n_groups, gidx, gout = entry.extra_held[:3]
            self._groups[k] = int(n_groups)
            _n_in, n_out, scale, bias_s, bias_v, floor, clip = entry.head
            table[k] = (_pointer(gidx), _pointer(gout), _pointer(bias_v), n_groups, n_out,
                        scale, bias_s, floor, clip)
        self.table = cp.asarray(table.view(np.uint8))
        self._threads = config.held_threads
        self._blocks = config.held_cluster  # one cluster: its blocks run together
        self._kernels = {name: module.get_function(name)
                         for name in sorted({kernel_name(d) for d in set(self._degrees) if d})}

    def run_length(self, todo: Sequence[tuple[int, bool]], i: int) -> int:
        """How many entries of ``todo`` from ``i`` on are consecutive layers of one
        degree on the shared-sum kernel (1 where ``todo[i]`` is not one)."""
        k0 = todo[i][0]
        degree = self._degrees[k0]
        if not degree:
            return 1
        n = 1
        while (i + n < len(todo) and todo[i + n][0] == k0 + n
               and self._degrees[k0 + n] == degree):
            n += 1
        return n

    def threads(self, k0: int, n_layers: int, held: int) -> int:
        """Threads a block for layers ``k0`` on: the warps the widest layer's groups
        fill (a warp step takes 128 / ``held`` groups), at most ``held_threads``: warps
        with no group would only add to every barrier."""
        steps = -(-max(self._groups[k0:k0 + n_layers]) // (128 // held))
        return min(self._threads, 32 * -(-steps // self._blocks))

    def launch(self, ptrs: Any, state: Any, live_hist: Any, stamps: Any, k0: int,
               n_layers: int, held: int) -> None:
        """Enqueue layers ``k0`` .. ``k0 + n_layers - 1`` on ``held`` rows, one launch."""
        kern = self._kernels[kernel_name(self._degrees[k0])]
        kern((self._blocks,), (self.threads(k0, n_layers, held),),
             (ptrs, self.table, np.int32(k0), np.int32(n_layers), np.int32(held), state,
              live_hist, stamps))
