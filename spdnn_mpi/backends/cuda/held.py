"""Converged layers in one launch (``cuda/spdnn_held.cu``): once the compressed rows
fit one tile, a run of consecutive uniform grouped layers of one degree is one
launch, where each layer alone cost its launch and the drain between kernels
(7.2-8.0 us a converged layer, H200). Layers up to ``ROW_MAX_WIDTH`` wide run one
block a row held (``layers_held_row``: a row's features stay in its block's shared
memory, so blocks never wait for each other); wider ones over the card
(``layers_held_grid``: one block an SM, a cooperative launch, a barrier between two
layers), or as a flow where each layer before a run's last stores one value a group
(``layers_held_flow``, ``cuda/spdnn_flow.cu``: a lane waits only for the groups it
reads, tagged with their layer, with a barrier only every 16 layers).

Inside a run, a layer whose next layer reads it stores one value a group where it
has one bias (its 16 slots hold the same value), and that next layer reads its inputs
as those groups' ids, made once at load (two launches for 128 layers): a sixteenth of
the stores, and reads from a smaller array.

While more than a tile of rows is held, consecutive uniform grouped layers from
``RUN_FIRST_LAYER`` on, up to ``RUN_MAX_WIDTH`` wide, run ``RUN_MAX_LAYERS`` at most
in one launch over every tile held (``layers_run_grid``, ``cuda/spdnn_runs.cu``):
by then the rows have settled, and no compaction is made inside a run.

Host logic: which layers qualify, the per-layer argument table, the runs of a piece.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.backends.cuda.launch import LayerLaunch, device_pointer

#: ``HeldLayer`` of cuda/spdnn_held.cu, field for field (offsets and size included).
HELD_LAYER_DTYPE = np.dtype({
    "names": ["gidx", "gout", "bias_v", "n_groups", "n_in", "n_out", "scale", "bias_s",
              "floor", "clip", "gidx_grp"],
    "formats": [np.uint64, np.uint64, np.uint64, np.int32, np.int32, np.int32, np.float32,
                np.float32, np.float32, np.float32, np.uint64],
    "offsets": [0, 8, 16, 24, 28, 32, 36, 40, 44, 48, 56],
    "itemsize": 64,
})

#: Widest layer (inputs or outputs) run one block a row held; wider ones run over the
#: card. A converged layer (H100, compressed): one block a row 1.34 / 2.18 us at
#: N = 1024 / 4096, over the card 3.02 / 3.07 us; at 16384 one block a row (two
#: rows of 64 KB in its shared memory) 7.26 us against 3.23 over the card. With one
#: epilogue a group since: 0.70 / 1.63 us one block a row, 2.40 us over the card at
#: 16384; with one value a group stored inside a run, 0.64 / 1.44 and 2.11-2.14 us
#: (the other forms not measured again).
ROW_MAX_WIDTH = 4096
#: Kernel of each form: one block a row held, one block an SM; ``flow`` is the grid
#: form without a barrier a layer, for runs whose layers before the last store one
#: value a group (``cuda/spdnn_flow.cu``).
KERNELS = {"row": "layers_held_row", "grid": "layers_held_grid", "flow": "layers_held_flow"}
#: Runs of this many layers at least flow (tests set it past every run to launch
#: ``layers_held_grid`` alone).
FLOW_MIN_LAYERS = 2
#: Slots of the flow's ring (``FLOW_RING`` of cuda/spdnn_flow.cu): a layer's group
#: values each, 32 rows of 8-byte words a group.
FLOW_RING = 32
#: Words of the flow's scratch before a layer's alive bits (``FLOW_HEAD``).
FLOW_HEAD = 32
#: Layers over every tile in one launch (while more than a tile of rows is held).
RUN_KERNEL = "layers_run_grid"
#: First layer (0-based) that runs in a launch of many over every tile: before it
#: the rows still die fast, and a layer a launch drops them as they die.
RUN_FIRST_LAYER = 32
#: Layers in one such launch at most: the compaction the last one's plan asks for
#: is made between two runs.
RUN_MAX_LAYERS = 32
#: Widest layer (inputs or outputs) run so: direct 1024 x 1920 2.1x, 4096 x 1920 2.7x
#: (H100); wider layers take 0.17 ms and more, and were not measured in runs.
RUN_MAX_WIDTH = 4096
#: Blocks an SM of ``layers_run_grid`` at most (its launch bounds: RUN_BLOCKS_PER_SM in
#: cuda/spdnn_runs.cu).
RUN_BLOCKS_PER_SM = 2
#: Kernels that make the group ids a run's later layers read (``HeldLayers``).
GROUP_INPUT_KERNELS = ("held_group_of", "held_group_inputs")
#: Layers whose group ids one pair of those launches makes (their scratch: this many
#: rows of the widest layer, 2 bytes an output).
GROUP_INPUT_CHUNK = 128


def supported(props: dict) -> bool:
    """Whether converged layers run in one launch on the device: compute capability
    9.0 on, the cards the forms were measured on (older ones keep a launch a layer)."""
    return int(props.get("major", 0)) >= 9


def kernel_name(degree: int, form: str) -> str:
    """The instantiation of ``form`` for layers of ``degree`` inputs an output (any
    rows held: one a degree, since NVRTC's time grows with each)."""
    return f"{KERNELS[form]}<{degree}>"


def held_form(plan: lay.LayerPlan, n_in: int, n_out: int) -> tuple[int, str] | None:
    """(degree, form) of a layer of this plan and shape in the one-launch kernels once
    rows are held: shared-sum grouped layers; None for the others."""
    if not plan.is_shared_sum:
        return None
    return plan.degree, "row" if max(n_in, n_out) <= ROW_MAX_WIDTH else "grid"


def run_degree(k: int, plan: lay.LayerPlan, n_in: int, n_out: int) -> int:
    """The degree of layer ``k`` where it may run in a launch of many over every tile
    (``layers_run_grid``), else 0."""
    if k < RUN_FIRST_LAYER or max(n_in, n_out) > RUN_MAX_WIDTH:
        return 0
    form = held_form(plan, n_in, n_out)
    return form[0] if form else 0


def kernel_names(plans: Sequence[lay.LayerPlan], layers: Sequence) -> set[str]:
    """Every instantiation the layers (``plans``, one a layer) may run in."""
    forms = [held_form(p, layer.n_in, layer.n_out) for p, layer in zip(plans, layers)]
    names = {kernel_name(*form) for form in forms if form}
    names |= {kernel_name(form[0], "flow") for form in forms if form and form[1] == "grid"}
    runs = (run_degree(k, p, layer.n_in, layer.n_out)
            for k, (p, layer) in enumerate(zip(plans, layers)))
    return names | {f"{RUN_KERNEL}<{d}>" for d in runs if d}


def _form(entry: LayerLaunch) -> tuple[int, str] | None:
    """The layer's ``held_form``."""
    return held_form(entry.plan, entry.n_in, entry.n_out)


def _span(todo: Sequence[tuple[int, bool]], i: int, keys: Sequence, most: int) -> int:
    """How many entries of ``todo`` from ``i`` on (``most`` at most) are consecutive
    layers whose key in ``keys`` (one a layer) is ``todo[i]``'s; 1 where that key is
    empty (the layer runs alone)."""
    k0 = todo[i][0]
    key = keys[k0]
    if not key:
        return 1
    n = 1
    while (i + n < len(todo) and n < most and todo[i + n][0] == k0 + n
           and keys[k0 + n] == key):
        n += 1
    return n


class HeldLayers:
    """The network's argument table and kernels; the runs of a piece to launch as one."""

    def __init__(self, cp: Any, module: Any, entries: Sequence[LayerLaunch],
                 config: KernelConfig, n_sms: int,
                 blocks_per_sm: Callable[[Any, int, int], int]) -> None:
        self._forms = [_form(e) for e in entries]
        self._runs = [run_degree(k, e.plan, e.n_in, e.n_out) for k, e in enumerate(entries)]
        self._grouped_ids = None  # ids of groups the later layers of a run read
        self._groups = [0] * len(entries)  # groups of each shared-sum layer
        self._widths = [0] * len(entries)
        table = np.zeros(len(entries), dtype=HELD_LAYER_DTYPE)
        for k, (entry, form) in enumerate(zip(entries, self._forms)):
            if not form:
                continue
            n_groups, gidx, gout = entry.extra_held[:3]
            self._groups[k] = int(n_groups)
            n_in, n_out, scale, bias_s, bias_v, floor, clip = entry.head
            self._widths[k] = max(int(n_in), int(n_out))
            table[k] = (device_pointer(gidx), device_pointer(gout), device_pointer(bias_v),
                        n_groups, n_in, n_out, scale, bias_s, floor, clip, 0)
        grouped_inputs = self._group_inputs(cp, table)
        self.table = cp.asarray(table.view(np.uint8))
        # layers that read their inputs as groups of the layer before (gidx_grp)
        self._reads_groups = [False] * len(entries)
        if grouped_inputs is not None:
            self._make_group_inputs(cp, module, *grouped_inputs)
            for k in grouped_inputs[0]:
                self._reads_groups[k] = True
        self._ring = self._flow = None  # the flow's ring of group values and its words
        flowing = [self._groups[k - 1] for k in range(1, len(entries))
                   if self._reads_groups[k] and self._forms[k][1] == "grid"]
        if flowing:
            self._ring_groups = max(flowing)
            self._ring = cp.zeros(FLOW_RING * self._ring_groups * 32, dtype=np.uint64)
            self._flow = cp.zeros(FLOW_HEAD + len(entries), dtype=np.uint32)
        # the row form's alive bits: a row's run of n layers takes ceil(n / 32) words
        self._live_bits = cp.zeros(32 * -(-len(entries) // 32), dtype=np.uint32)
        self._threads = {"row": config.held_row_threads, "grid": config.held_threads}
        self._n_sms = n_sms  # the grid form's blocks: one an SM, all resident
        names = {kernel_name(*f) for f in self._forms if f}
        if flowing:
            names |= {kernel_name(f[0], "flow") for f in self._forms if f and f[1] == "grid"}
        self._kernels = {name: module.get_function(name) for name in sorted(names)}
        self._run_kernels = {d: module.get_function(f"{RUN_KERNEL}<{d}>")
                             for d in sorted(set(self._runs) - {0})}
        self._run_grid = {d: n_sms * min(RUN_BLOCKS_PER_SM,
                                         blocks_per_sm(kern, config.held_threads, 0))
                          for d, kern in self._run_kernels.items()}

    def _group_inputs(self, cp: Any, table: np.ndarray):
        """The layers that read their inputs as groups of the layer before inside a
        run: the same form and degree as it, which has one bias, so it stores one
        value a group (cuda/spdnn_held.cu). Their ids' array is allocated here and
        named in ``table``; None if no layer qualifies."""
        listed = [k for k in range(1, len(table))
                  if self._forms[k] and self._forms[k] == self._forms[k - 1]
                  and int(table[k - 1]["bias_v"]) == 0]
        if not listed:
            return None
        counts = np.array([self._groups[k] * self._forms[k][0] for k in listed], np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        self._grouped_ids = cp.empty(int(offsets[-1]), dtype=np.uint16)
        base = device_pointer(self._grouped_ids)
        for k, offset in zip(listed, offsets):
            table[k]["gidx_grp"] = base + 2 * int(offset)
        width = max(int(table[k - 1]["n_out"]) for k in listed)
        return listed, counts, width

    def _make_group_inputs(self, cp: Any, module: Any, listed: list[int],
                           counts: np.ndarray, width: int) -> None:
        """Launch the kernels that write the ids ``_group_inputs`` allocated (on the
        current stream, behind the layouts), a chunk of layers at a time."""
        group_of, inputs = (module.get_function(name) for name in GROUP_INPUT_KERNELS)
        owner = cp.empty(min(len(listed), GROUP_INPUT_CHUNK) * width, dtype=np.uint16)
        for i in range(0, len(listed), GROUP_INPUT_CHUNK):
            part = cp.asarray(np.asarray(listed[i:i + GROUP_INPUT_CHUNK], dtype=np.int32))
            sizes = counts[i:i + GROUP_INPUT_CHUNK]
            grid = (max(1, min(-(-int(sizes.max()) // 256), 32)), len(sizes))
            group_of(grid, (256,), (self.table, part, np.int32(width), owner))
            inputs(grid, (256,), (self.table, part, cp.asarray(sizes.astype(np.int32)),
                                  np.int32(width), owner))

    def run_length(self, todo: Sequence[tuple[int, bool]], i: int) -> int:
        """How many entries of ``todo`` from ``i`` on are consecutive layers of one
        degree and one form on the shared-sum kernel (1 where ``todo[i]`` is not one)."""
        return _span(todo, i, self._forms, len(todo))

    def tile_run_length(self, todo: Sequence[tuple[int, bool]], i: int) -> int:
        """How many entries of ``todo`` from ``i`` on run as one launch over every tile
        (``RUN_MAX_LAYERS`` at most; 1 where ``todo[i]`` does not run so)."""
        return _span(todo, i, self._runs, RUN_MAX_LAYERS)

    def launch_run(self, ptrs: Any, state: Any, live_hist: Any, stamps: Any, k0: int,
                   n_layers: int, drop_dead: bool) -> None:
        """Enqueue layers ``k0`` .. ``k0 + n_layers - 1`` over every tile held, one
        cooperative launch; ``drop_dead``: the last layer's plan may compact."""
        degree = self._runs[k0]
        self._run_kernels[degree].kernel(
            (self._run_grid[degree],), (self._threads["grid"],),
            (ptrs, self.table, np.int32(k0), np.int32(n_layers), np.int32(drop_dead),
             state, live_hist, stamps), enable_cooperative_groups=True)

    def flows(self, k0: int, n_layers: int, held: int) -> bool:
        """Whether layers ``k0`` .. ``k0 + n_layers - 1`` of the grid form run as a flow
        (``layers_held_flow``) on ``held`` rows: every layer after the first reads
        groups of the layer before, so each layer before the last stores one value a
        group, and each layer's warp steps fit the card at once. A flow's lane loads
        two rows' tagged words (8 bytes a row) where the grid's loads four rows' floats
        in the same registers, so it takes twice the warps; where those exceed one
        wave, a warp's second step waits on its first (65536 wide, 32 rows held: a
        converged layer 4.4 against 3.0 us, H100, 2026-12-08)."""
        if (self._forms[k0][1] != "grid" or self._ring is None
                or n_layers < FLOW_MIN_LAYERS or not all(self._reads_groups[k0 + 1:k0 + n_layers])):
            return False
        steps = -(-max(self._groups[k0:k0 + n_layers]) // (64 // held))
        return steps <= self._n_sms * (self._threads["grid"] // 32)

    def threads(self, k0: int, n_layers: int, held: int) -> int:
        """Threads a block for layers ``k0`` on, at most the form's: one a group of the
        widest layer (one block a row), or the warps its groups fill over the card (a
        warp step takes 128 / ``held`` groups, a flow's 64 / ``held``): warps with no
        group would only add to every barrier."""
        form = self._forms[k0][1]
        groups = max(self._groups[k0:k0 + n_layers])
        if form == "row":
            return min(self._threads[form], 32 * -(-groups // 32))
        rows_a_lane = 2 if self.flows(k0, n_layers, held) else 4
        steps = -(-groups // (32 * rows_a_lane // held))
        return min(self._threads[form], 32 * -(-steps // self._n_sms))

    def launch(self, ptrs: Any, state: Any, live_hist: Any, stamps: Any, k0: int,
               n_layers: int, held: int) -> None:
        """Enqueue layers ``k0`` .. ``k0 + n_layers - 1`` on ``held`` rows, one launch."""
        form = self._forms[k0][1]
        kern = self._kernels[kernel_name(*self._forms[k0])]
        threads = (self.threads(k0, n_layers, held),)
        if form == "row":  # a block a row held; two rows of features in shared memory
            width = max(self._widths[k0:k0 + n_layers])
            kern((held,), threads, (ptrs, self.table, np.int32(k0), np.int32(n_layers),
                                    np.int32(width), state, live_hist, stamps,
                                    self._live_bits), shared_mem=8 * width)
            return
        # a RawKernel launches as its module was built; its compiled function takes
        # the cooperative flag (all blocks resident, or the launch fails)
        if self.flows(k0, n_layers, held):
            flow = self._kernels[kernel_name(self._forms[k0][0], "flow")]
            flow.kernel((self._n_sms,), threads,
                        (ptrs, self.table, np.int32(k0), np.int32(n_layers), np.int32(held),
                         state, live_hist, stamps, self._ring, np.int32(self._ring_groups),
                         self._flow), enable_cooperative_groups=True)
            return
        kern.kernel((self._n_sms,), threads,
                    (ptrs, self.table, np.int32(k0), np.int32(n_layers), np.int32(held),
                     state, live_hist, stamps), enable_cooperative_groups=True)
