"""One layer's launch on the CUDA backend: kernel, grids, device layout, arguments.

Host logic over a compiled module, tested without a GPU (NumPy as the array module,
kernels given by name).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.backends.cuda.grouping import device_group_layouts
from spdnn_mpi.model import Layer

#: Warp steps a warp of the grouped kernels takes in a row before striding on; 4: 52.9
#: against 54.6-57.3 TE/s at 1024 x 120 (H200, 2026-12-03).
GROUP_CHUNK = 1
#: Inputs from which the shared-sum grouped kernel runs one block an SM where two
#: fit: 1.11-1.15x in both modes from 16384 wide (H100, 2026-12-07, beside two
#: blocks in one call; 65536 x 1920 compressed 2678 against 2378 TE/s), but with one
#: block at every width 4096 x 120 direct ran 140.0-140.9 against 142.5-143.6, so
#: narrower layers keep two. (Half the warps stream half the bytes between the two
#: reads of an input line, so more second reads may hit in L2; not profiled.)
ONE_BLOCK_MIN_INPUTS = 8192


def blocks_per_sm(props: dict, kern: Any, threads: int, smem: int) -> int:
    """Blocks of ``kern`` (``threads`` each, ``smem`` dynamic shared bytes) that fit on
    one SM of a device with CUDA properties ``props``: registers, threads, shared
    memory (1 KB a block reserved)."""
    regs = max(1, int(kern.num_regs))
    static = int(kern.shared_size_bytes)
    by_regs = int(props["regsPerMultiprocessor"]) // (((regs + 7) // 8) * 8 * threads)
    by_threads = int(props["maxThreadsPerMultiProcessor"]) // threads
    by_smem = (int(props["sharedMemPerMultiprocessor"]) // (smem + static + 1024)
               if smem + static else by_threads)
    return max(1, min(by_regs, by_threads, by_smem))


class Launch(NamedTuple):
    """The shape of one kernel launch."""

    kern: Any  # the kernel (CuPy RawKernel; a fake in tests)
    grid: int  # blocks
    threads: int  # threads a block
    smem: int  # dynamic shared memory a block, bytes


def device_pointer(array: Any) -> int:
    """The device address of a ``head`` or ``extra`` argument for a kernel's argument
    table; 0 for a scalar that stands in for an absent array (no bias vector)."""
    return 0 if isinstance(array, np.integer) else int(array.data.ptr)


@dataclass(frozen=True)
class LayerLaunch:
    """Everything the layer loop needs to launch one layer (``Launcher.layer_entry``).

    A kernel's arguments are the pointer table, ``head``, the device state, then the
    layout arguments: ``extra`` over whole tiles, ``extra_held`` once at most one tile
    of rows is held.
    """

    plan: lay.LayerPlan
    full: Launch  # the whole-tile form: as many blocks as fit on the device
    small: dict[int, Launch]  # rows held (8, 16 or 32, in one tile) -> their launch
    n_in: int
    n_out: int
    head: tuple  # n_in, n_out, scale, scalar bias, bias vector, floor, clip
    extra: tuple
    extra_held: tuple
    keep: tuple  # the device arrays the arguments point to (kept alive here)

    def form(self, held: int) -> tuple[Launch, tuple]:
        """(launch, layout arguments) with ``held`` rows held (0: whole tiles)."""
        if held:
            return self.small[held], self.extra_held
        return self.full, self.extra

    @property
    def layout_bytes(self) -> int:
        """Device bytes of the layer's layout."""
        return sum(int(a.nbytes) for a in self.keep)


@dataclass
class Launcher:
    """What building a layer's launch needs from the backend."""

    cp: Any  # the array module of the layouts (CuPy; NumPy in tests)
    mod: Any  # the compiled module: get_function(name)
    config: KernelConfig
    sms: int
    variant: str
    blocks_per_sm: Callable[[Any, int, int], int]  # (kernel, threads, shared bytes)

    def threads(self, kind: str) -> int:
        """Threads a block of the kernels of ``kind``."""
        if kind in ("smem32", "csr4_smem"):
            return self.config.smem_threads
        return self.config.group_threads if kind == "group" else self.config.global_threads

    def kernel(self, name: str, smem_bytes: int):
        """A kernel of the module, allowed ``smem_bytes`` of dynamic shared memory."""
        kern = self.mod.get_function(name)
        # only ever raised: the limit is shared by every layer of that kernel
        if smem_bytes > 48 * 1024 and kern.max_dynamic_shared_size_bytes < smem_bytes:
            kern.max_dynamic_shared_size_bytes = smem_bytes
        return kern

    def group_layouts(self, layers: Sequence[Layer]) -> list[lay.GroupLayout]:
        """The group layouts of fixed-degree ``layers`` of one shape, built on the device."""
        return device_group_layouts(self.cp, self.mod, layers, self.sms)

    def launch(self, plan: lay.LayerPlan, n_in: int) -> Launch:
        """``plan``'s whole-tile form for a layer of ``n_in`` inputs: as many blocks as
        fit on the device (the shared-sum grouped kernel from ``ONE_BLOCK_MIN_INPUTS``
        inputs: one an SM)."""
        kern = self.kernel(plan.kernel, plan.smem_bytes)
        threads = self.threads(plan.kind)
        per_sm = self.blocks_per_sm(kern, threads, plan.smem_bytes)
        if plan.is_shared_sum and n_in >= ONE_BLOCK_MIN_INPUTS:
            per_sm = 1
        return Launch(kern, self.sms * per_sm, threads, plan.smem_bytes)

    def small_grids(self, layer: Layer, plan: lay.LayerPlan, full: Launch,
                    n_groups: int) -> dict[int, Launch]:
        """Rows held (one tile at most) -> their launch (``full``: the whole-tile form)."""
        kern, grid = full.kern, full.grid
        small = {}
        if plan.kind == "group":  # the same kernel over the one tile
            warps = self.config.group_threads // 32
            # groups a warp step: 4 in the shared-sum form (a lane computes all 16 slots)
            per_step = 4 if "group_sum" in plan.kernel else self.config.group_lane_slots // 4
            g = max(1, min(grid, -(-n_groups // (per_step * warps))))
            return {rows: Launch(kern, g, self.threads("group"), 0) for rows in lay.ELL_ROWS}
        for rows in lay.ELL_ROWS:
            k_rows = kern
            if plan.is_ell:
                k_rows = self.kernel(lay.ell_kernel(plan.kind, plan.degree, rows), plan.smem_bytes)
            # ~16 output steps per block: a staged tile serves 16 warps; through
            # L1/L2 at least one block per SM, as many as the work fills
            steps = -(-layer.n_out // (128 // rows))
            g = (max(1, min(grid, steps // 16)) if plan.kind in ("smem32", "csr4_smem")
                 else min(grid, max(self.sms, -(-steps // 16))))
            small[rows] = Launch(k_rows, g, self.threads(plan.kind), plan.smem_bytes)
        return small

    def layer_entry(self, layer: Layer, plan: lay.LayerPlan, smem_limit: int,
                    grouped: lay.GroupLayout | None = None) -> LayerLaunch:
        """Upload one layer's layout; its kernel, grids and launch arguments.

        ``grouped``: the layer's group layout, built with others of its shape by
        ``group_layouts`` (else built here).
        """
        cp = self.cp
        groups = None
        if plan.kind == "group":
            groups = grouped or self.group_layouts([layer])[0]
            if lay.falls_back(groups, self.variant):
                plan, groups = lay.plan_layer(layer, smem_limit, self.variant, grouped=False), None
        full = self.launch(plan, layer.n_in)
        keep: list = []  # device arrays the launch arguments point to
        extra_held = None
        if groups is not None:
            keep += [groups.indices, groups.out_ids, groups.weights]
            group_args = (np.int32(groups.n_groups), groups.indices, groups.out_ids,
                          groups.weights, np.int32(groups.wstride))
            extra: tuple = (*group_args, np.int32(GROUP_CHUNK))
            extra_held = (*group_args, np.int32(1))
        elif plan.is_ell:
            extra = lay.ell_layout(layer, cp)
            keep += list(extra)
        elif plan.kind.startswith("csr4"):
            extra = lay.csr4_layout(layer, cp)
            keep += list(extra)
        else:
            ptr = cp.asarray(np.asarray(layer.indptr, dtype=np.int32))
            itype = np.uint16 if "u16" in plan.kernel else np.int32
            idx = cp.asarray(np.asarray(layer.indices, dtype=itype))
            if layer.values is not None:
                vals = cp.asarray(np.asarray(layer.values, dtype=np.float32))
            else:
                vals = cp.zeros(1, dtype=np.float32)
            keep += [ptr, idx, vals]
            extra = (ptr, idx, vals)
        # Once one tile is held, grouped layers keep their kernel over it (small grid):
        # a gather a group, where the ELL few-row forms gather per output.
        small = self.small_grids(layer, plan, full,
                                 groups.n_groups if groups is not None else 0)
        if layer.bias_is_scalar:
            bias_s, bias_v = np.float32(layer.bias), np.uint64(0)
        else:
            bias_s = np.float32(0.0)
            bias_v = cp.asarray(np.asarray(layer.bias, dtype=np.float32))
            keep.append(bias_v)
        scale = np.float32(1.0 if layer.values is not None else layer.uniform_value)
        clip = np.float32(np.inf if layer.clip is None else layer.clip)
        head = (np.int32(layer.n_in), np.int32(layer.n_out), scale, bias_s, bias_v,
                np.float32(layer.floor), clip)
        return LayerLaunch(plan, full, small, layer.n_in, layer.n_out, head, extra,
                           extra_held or extra, tuple(keep))
