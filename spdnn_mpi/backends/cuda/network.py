"""Building a network's device layout on the CUDA backend: plan every layer,
compile the module its kernels need, upload each layer's layout (timed apart from
inference: ``layout_seconds``, ``compile_seconds``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spdnn_mpi.backends.cuda import held as held_layers
from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda import whole as whole_network
from spdnn_mpi.backends.cuda.compile import (
    KernelModules,
    fallback_names,
    kernel_names,
    module_and_whether_compiled,
)
from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.backends.cuda.launch import Launcher, LayerLaunch, blocks_per_sm
from spdnn_mpi.model import Layer

#: What the runtime reserves of a block's opt-in shared memory limit.
SMEM_RESERVED = 1024
#: Most weight indices grouped in one pass (``group_runs``): bounds the pass's
#: temporary device memory (a few times this many 2-byte entries).
GROUP_BATCH_ENTRIES = 1 << 27


@dataclass
class DeviceNetwork:
    """A network on the device: the compiled module and every layer's launch."""

    module: Any
    layers: list[LayerLaunch]
    width: int  # the widest layer's inputs or outputs
    held: held_layers.HeldLayers | None  # converged layers in one launch (None: not here)
    whole: whole_network.WholeNetwork | None  # small batches in one launch (None: not so)
    info: dict = field(default_factory=dict)  # kernels, layout size and times (describe)


def smem_limit(props: dict) -> int:
    """Dynamic shared memory a block of the layer kernels may have on this device."""
    return int(props["sharedMemPerBlockOptin"]) - SMEM_RESERVED


def plan_layers(props: dict, variant: str, layers: Sequence[Layer]) -> list[lay.LayerPlan]:
    """The kernel plan of every layer on a device with CUDA properties ``props``."""
    return [lay.plan_layer(layer, smem_limit(props), variant) for layer in layers]


def network_kernels(props: dict, variant: str, layers: Sequence[Layer]) -> list[str]:
    """The kernel instantiations ``layers`` need on a device with ``props``."""
    plans = plan_layers(props, variant, layers)
    return _kernel_names(props, plans, layers, _runs_whole(props, plans, layers))


def _kernel_names(props: dict, plans: Sequence[lay.LayerPlan], layers: Sequence[Layer],
                  whole: bool) -> list[str]:
    """``kernel_names`` of ``plans``, the one-launch forms where the device runs them
    and (``whole``: ``_runs_whole``) the whole network's."""
    names = kernel_names(plans, layers if held_layers.supported(props) else None)
    return sorted({*names, whole_network.KERNEL}) if whole else names


def _runs_whole(props: dict, plans: Sequence[lay.LayerPlan], layers: Sequence[Layer]) -> bool:
    """Whether small batches of ``layers`` run every layer in one launch (``whole``)."""
    return whole_network.qualifies(plans, network_width(layers),
                                   sum(layer.nnz for layer in layers), smem_limit(props))


def network_width(layers: Sequence[Layer]) -> int:
    """The widest layer's inputs or outputs (0 without layers)."""
    return max((max(layer.n_in, layer.n_out) for layer in layers), default=0)


def group_runs(build: Callable[[Sequence[Layer]], list[lay.GroupLayout]],
               layers: Sequence[Layer], plans: list[lay.LayerPlan]) -> dict[int, lay.GroupLayout]:
    """Layer index -> group layout of every layer planned on the
    grouped kernel, built in runs of consecutive layers of one shape (at most
    ``GROUP_BATCH_ENTRIES`` indices a run) rather than one small pass a layer."""
    out: dict[int, lay.GroupLayout] = {}
    k = 0
    while k < len(layers):
        if plans[k].kind != "group":
            k += 1
            continue
        first = layers[k]
        shape = (first.n_in, first.n_out, first.row_degree, first.values is None)
        per_layer = first.n_out * first.row_degree
        j = k + 1
        while (j < len(layers) and plans[j].kind == "group" and (j - k + 1) * per_layer
               <= GROUP_BATCH_ENTRIES and (layers[j].n_in, layers[j].n_out,
                                           layers[j].row_degree,
                                           layers[j].values is None) == shape):
            j += 1
        for i, built in enumerate(build(layers[k:j])):
            out[k + i] = built
        k = j
    return out


def build_network(cp: Any, device: Any, stream: Any, device_id: int, props: dict,
                  variant: str, config: KernelConfig, layers: Sequence[Layer],
                  progress: Callable[[int], None] | None = None) -> DeviceNetwork:
    """Plan, compile and upload ``layers`` on ``device`` (``progress(layers done)``
    after each); waits until the uploads are done."""
    t0 = time.perf_counter()
    sms = int(props["multiProcessorCount"])
    smem = smem_limit(props)
    plans = plan_layers(props, variant, layers)
    whole = _runs_whole(props, plans, layers)
    names = _kernel_names(props, plans, layers, whole)
    t_compile = time.perf_counter()
    first, compiled = module_and_whether_compiled(device_id, names, config)
    compile_s = time.perf_counter() - t_compile
    module = KernelModules(first, names)
    launcher = Launcher(cp, module, config, sms, variant,
                        functools.partial(blocks_per_sm, props))
    kinds: dict[str, int] = {}
    forms: dict[str, int] = {}  # kernels by name (layer_group_sum<32>, ...)
    entries: list[LayerLaunch] = []
    width = network_width(layers)
    with device, stream:
        grouped = group_runs(launcher.group_layouts, layers, plans)
        # grouped layers whose groups came out too sparse fall back to another kernel,
        # compiled now (a second program) where the first has not got it
        fallen = [lay.plan_layer(layers[k], smem, variant, grouped=False)
                  for k, groups in grouped.items() if lay.falls_back(groups, variant)]
        extra = fallback_names(fallen, names)
        if extra:
            t_compile = time.perf_counter()
            second, compiled_more = module_and_whether_compiled(device_id, extra, config)
            compile_s += time.perf_counter() - t_compile
            compiled = compiled or compiled_more
            module.add(second, extra)
        for k, (layer, plan) in enumerate(zip(layers, plans)):
            entry = launcher.layer_entry(layer, plan, smem, grouped.get(k))
            kinds[entry.plan.kind] = kinds.get(entry.plan.kind, 0) + 1
            forms[entry.plan.kernel] = forms.get(entry.plan.kernel, 0) + 1
            entries.append(entry)
            if progress is not None:
                progress(len(entries))
        held = (held_layers.HeldLayers(cp, module, entries, config, sms,
                                       launcher.blocks_per_sm)
                if held_layers.supported(props) else None)
        one_launch = (whole_network.WholeNetwork(cp, module, entries, width, sms,
                                                 launcher.blocks_per_sm) if whole else None)
        stream.synchronize()
    info = {
        "kernels": kinds,
        "kernel_names": forms,
        "layout_bytes": sum(e.layout_bytes for e in entries),
        "layout_seconds": round(time.perf_counter() - t0 - compile_s, 4),
        "compile_seconds": round(compile_s, 4),
        "kernels_compiled": compiled,
        "grids": sorted({(e.plan.kind, e.full.grid, e.full.threads) for e in entries}),
        # batches of at most this many rows run every layer in one launch (0: none)
        "whole_network_rows": 0 if one_launch is None else one_launch.max_rows,
    }
    return DeviceNetwork(module, entries, width, held, one_launch, info)
