"""Host side of the CUDA backend that needs no GPU: kernel sources and layouts
(apart from the backend so CPU-only machines can test them)."""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Layer, stacked_indices

#: The kernel sources, compiled together as one NVRTC program.
KERNEL_HEADERS = ("spdnn_common.cuh", "spdnn_layer.cuh", "spdnn_held.cuh", "spdnn_csr4.cuh")
KERNEL_UNITS = ("spdnn_layers.cu", "spdnn_groups.cu", "spdnn_rows.cu", "spdnn_merge.cu",
                "spdnn_held.cu", "spdnn_flow.cu", "spdnn_runs.cu", "spdnn_group_layout.cu",
                "spdnn_whole.cu")

#: Rows per feature tile (one warp, one lane per row).
TILE_ROWS = 32

_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$", re.MULTILINE)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def kernel_source_dir():
    """Folder (Path or importlib Traversable) of the ``.cu``/``.cuh`` files: ``<repo>/cuda``
    in a checkout, package ``spdnn_mpi.kernels`` once installed (setup.cfg ``package_dir``)."""
    checkout = Path(__file__).resolve().parents[3] / "cuda"
    if (checkout / KERNEL_UNITS[0]).is_file():
        return checkout
    try:
        installed = importlib.resources.files("spdnn_mpi.kernels")
    except ModuleNotFoundError:
        installed = None
    if installed is not None and installed.joinpath(KERNEL_UNITS[0]).is_file():
        return installed
    raise SpdnnError(
        f"CUDA kernel sources not found: looked in {checkout} and in the installed "
        "package spdnn_mpi.kernels; reinstall spdnn_mpi"
    )


def assemble_source(config: KernelConfig | None = None) -> str:
    """One self-contained program: the ``#define`` block of ``config`` (default:
    the defaults), then every unit with its local ``#include "..."`` lines inlined
    once (NVRTC then needs no include path)."""
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return f"// {name} already included\n"
        seen.add(name)
        text = _PRAGMA_ONCE.sub("", kernel_source_dir().joinpath(name).read_text(encoding="utf-8"))
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    head = (config or KernelConfig()).define_block()
    return head + "\n".join(expand(unit) for unit in KERNEL_UNITS)


def source_digest(source: str, names: tuple[str, ...]) -> str:
    """Key of a compiled module: the program text and the instantiations asked for."""
    h = hashlib.sha256(source.encode())
    for n in names:
        h.update(n.encode())
    return h.hexdigest()[:16]


@dataclass
class LayerPlan:
    """How one layer runs on the device: which kernel, with which layout."""

    kind: str  # "group", "smem32", "global", "csr4_smem", "csr4_global", "csr_smem", "csr_global"
    kernel: str  # NVRTC name expression
    degree: int  # inputs per output (ELL kinds), 0 for CSR
    smem_bytes: int  # dynamic shared memory per block

    @property
    def is_ell(self) -> bool:
        """Fixed-degree uniform layout (``ell_layout``) rather than CSR."""
        return self.kind in ELL_KINDS

    @property
    def is_shared_sum(self) -> bool:
        """The grouped kernel's shared-sum form (``SUM_KERNEL``: uniform layers)."""
        return self.kernel.startswith(SUM_KERNEL + "<")


#: The grouped kernel of uniform layers: one sum a group and row (cuda/spdnn_groups.cu).
SUM_KERNEL = "layer_group_sum"
#: Kinds of the fixed-degree kernels, and the variants a user may force.
ELL_KINDS = ("smem32", "global")
#: Rows an ELL kernel computes per tile: all 32, or (one tile of compressed,
#: converged rows held) only the first 16 or 8, reading fewer bytes per input.
ELL_ROWS = (32, 16, 8)


def compacts_on_write(kind: str) -> bool:
    """Whether the kernels of ``kind`` move the survivors of the previous layer to dense
    tiles as they write (spdnn_layer.cuh); the others need a compact_rows pass first."""
    return kind not in ("csr_smem", "csr_global")


def ell_kernel(kind: str, degree: int, rows: int = 0) -> str:
    """NVRTC name of the ELL kernel of ``kind`` for ``degree`` inputs: the whole-tile
    form (``rows`` 0), or the form for at most ``rows`` rows held in one tile."""
    base = "layer_ell_smem" if kind == "smem32" else "layer_ell_global"
    return f"{base}<{degree},{rows or 32},{'true' if rows else 'false'}>"


def rows_bucket(rows: int) -> int:
    """Fewest rows of ``ELL_ROWS`` that hold ``rows`` (at most one tile)."""
    return min(r for r in ELL_ROWS if r >= rows)


VARIANTS = ("auto", "group", "smem32", "global", "csr")

#: Output slots of a group of the grouped kernel (cuda/spdnn_groups.cu).
GROUP_SLOTS = 16
#: Least mean fill of the groups (outputs / slots) for ``auto`` to keep the
#: grouped kernel: below it padded slots cost more than the shared loads save.
GROUP_MIN_FILL = 0.5
#: Most outputs for which ``auto`` reads a CSR4 layer's inputs through L1/L2 even where
#: the tile fits in shared memory (MNIST's 10-output layer: 6.4-7.7 against 9.5-10.2 us,
#: H200, 2026-12-04).
CSR4_NARROW_OUTPUTS = 16


def check_variant(variant: str) -> None:
    """Refuse a kernel variant this version does not have, naming the ones it has."""
    if variant not in VARIANTS:
        raise SpdnnError(f"unknown CUDA kernel variant {variant!r} (one of {', '.join(VARIANTS)})")


def plan_layer(layer: Layer, smem_limit: int, variant: str = "auto",
               grouped: bool = True) -> LayerPlan:
    """Pick the kernel for ``layer`` given the per-block shared memory limit.

    ``grouped`` False: too few outputs share their inputs (``GROUP_MIN_FILL``) for
    the grouped kernel. ``variant`` forces a kind (``smem32`` only where the tile
    fits; ``group`` whatever the fill; ``global``: inputs through L1/L2, ELL or CSR4).
    """
    check_variant(variant)
    d = layer.row_degree
    degree_ok = (
        d is not None
        and d % 8 == 0
        and 8 <= d <= 64
        and layer.n_in <= 65536
        and np.dtype(layer.indices.dtype) == np.uint16
    )
    ell_ok = degree_ok and layer.values is None
    tile_bytes = layer.n_in * TILE_ROWS * 4
    fits32 = tile_bytes <= smem_limit
    if degree_ok and (variant == "group" or (variant == "auto" and grouped)):
        # one weight for all: a group's slots share one sum (the same bits)
        kernel = SUM_KERNEL if layer.values is None else "layer_group"
        return LayerPlan("group", f"{kernel}<{d}>", d, 0)
    if ell_ok and variant != "csr":
        # staged tile: 39.0 against 30.8 TE/s at 1024 x 120 (H200, 2026-12-02)
        if fits32 and variant in ("auto", "smem32"):
            return LayerPlan("smem32", ell_kernel("smem32", d), d, tile_bytes)
        return LayerPlan("global", ell_kernel("global", d), d, 0)
    vals = "true" if layer.values is not None else "false"
    itype = "u16" if np.dtype(layer.indices.dtype) == np.uint16 else "int"
    if itype == "u16" and variant != "csr":  # float4 rows, 8 indices a load
        narrow = variant == "auto" and layer.n_out <= CSR4_NARROW_OUTPUTS
        if fits32 and variant != "global" and not narrow:
            return LayerPlan("csr4_smem", f"layer_csr4<true,{vals}>", 0, tile_bytes)
        return LayerPlan("csr4_global", f"layer_csr4<false,{vals}>", 0, 0)
    if fits32:
        return LayerPlan("csr_smem", f"layer_csr<true,{vals},{itype}>", 0, tile_bytes)
    return LayerPlan("csr_global", f"layer_csr<false,{vals},{itype}>", 0, 0)


@dataclass
class GroupLayout:
    """What the grouped kernel reads for one layer (``group_layout``)."""

    n_groups: int  # groups in the arrays, a multiple of 4 (the last ones may be empty)
    indices: object  # n_groups x degree uint16: the inputs every output of the group reads
    out_ids: object  # n_groups x GROUP_SLOTS int32: the output of each slot, -1 unused
    weights: object  # float32 weight blocks, degree x GROUP_SLOTS each, k-major
    wstride: int  # floats from one group's block to the next (0: one shared block)
    fill: float  # outputs / used groups' slots


def falls_back(groups: GroupLayout, variant: str) -> bool:
    """Whether ``auto`` leaves the grouped kernel for this layout (groups too sparse)."""
    return variant == "auto" and groups.fill < GROUP_MIN_FILL


_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)


def group_layout(layer: Layer) -> GroupLayout:
    """``group_layouts`` of one layer."""
    return group_layouts([layer])[0]


def group_layouts(layers: Sequence[Layer]) -> list[GroupLayout]:
    """Group the outputs of fixed-degree layers of one shape by identical input sets,
    all layers at once: the host reference of the device's ``grouping``.

    Equal sets are found exactly (a hash collision only splits a group); groups hold at
    most ``GROUP_SLOTS`` outputs, padded to a multiple of 4 groups per layer. Uniform
    layers share one block of ones.
    """
    n, n_out, d = len(layers), layers[0].n_out, layers[0].row_degree
    rows3 = stacked_indices(layers)  # (layers, n_out, d)
    words = rows3.reshape(n * n_out, d).view(np.uint64)  # d a multiple of 8: d / 4 words
    h = np.zeros(n * n_out, dtype=np.uint64)
    for c in range(words.shape[1]):
        h = (h ^ words[:, c]) * _HASH_MUL
    key = (rows3[:, :, 0].astype(np.uint64) << np.uint64(48)) | (h.reshape(n, n_out)
                                                                  >> np.uint64(16))
    order = np.argsort(key, axis=1, kind="stable")
    each = np.arange(n)[:, None]  # with ``order``: every layer's rows in its own order
    srt = rows3[each, order].reshape(n * n_out, d)
    pos = np.arange(n * n_out)
    start = pos % n_out == 0  # every layer starts its own runs
    start[1:] |= np.any(srt[1:] != srt[:-1], axis=1)
    within = pos - np.flatnonzero(start)[np.cumsum(start) - 1]
    slot = within % GROUP_SLOTS
    new = start | (slot == 0)
    gid = np.cumsum(new) - 1  # over all layers
    used = new.reshape(n, n_out).sum(axis=1)
    n_groups, first_group = group_counts(used)
    first_used = np.concatenate([[0], np.cumsum(used)[:-1]]).astype(np.int64)
    layer = pos // n_out
    group = gid - first_used[layer] + first_group[layer]
    total = int(n_groups.sum())
    out_ids = np.full((total, GROUP_SLOTS), -1, dtype=np.int32)
    out_ids[group, slot] = order.reshape(-1)
    indices = np.zeros((total, d), dtype=np.uint16)
    indices[group[new]] = srt[new]
    if layers[0].values is None:
        weights = np.ones(d * GROUP_SLOTS, dtype=np.float32)
    else:
        vals = np.stack([np.asarray(lay.values, dtype=np.float32)
                         for lay in layers]).reshape(n, n_out, d)
        weights = np.zeros((total, d, GROUP_SLOTS), dtype=np.float32)
        weights[group, :, slot] = vals[each, order].reshape(n * n_out, d)
    return split_group_layouts(used, indices, out_ids, weights, n_out)


def group_counts(used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(groups, first group) of each layer of a run, from the groups it uses: padded
    to a multiple of 4 (at least 4), the layers' groups back to back."""
    n_groups = -(-np.maximum(used, 1) // 4) * 4
    return n_groups, np.concatenate([[0], np.cumsum(n_groups)[:-1]]).astype(np.int64)


def split_group_layouts(used: np.ndarray, indices: Any, out_ids: Any, weights: Any,
                        n_out: int) -> list[GroupLayout]:
    """Each layer's ``GroupLayout`` from the arrays of its run (host or device): ``used``
    groups a layer (host), ``indices`` (groups, degree), ``out_ids`` (groups,
    ``GROUP_SLOTS``), ``weights`` one shared block (uniform layers) or (groups,
    degree, ``GROUP_SLOTS``)."""
    n_groups, first_group = group_counts(used)
    d = indices.shape[1]
    shared = weights.ndim == 1
    out = []
    for k in range(len(used)):
        lo, hi = int(first_group[k]), int(first_group[k] + n_groups[k])
        out.append(GroupLayout(int(n_groups[k]), indices[lo:hi].reshape(-1),
                               out_ids[lo:hi].reshape(-1),
                               weights if shared else weights[lo:hi].reshape(-1),
                               0 if shared else d * GROUP_SLOTS,
                               n_out / (used[k] * GROUP_SLOTS) if used[k] else 1.0))
    return out


def csr4_layout(layer: Layer, xp=np) -> tuple:
    """(spans, indices, values) the CSR4 kernel reads: output j's entries start
    at spans[j, 0], a multiple of 8, and number spans[j, 1]; the gaps are index
    0 and value 0 (loaded, never added). Values: one float when uniform."""
    deg = np.diff(np.asarray(layer.indptr, dtype=np.int64))
    padded = -(-deg // 8) * 8
    first = np.zeros(layer.n_out + 1, dtype=np.int64)
    np.cumsum(padded, out=first[1:])
    if first[-1] >= 2**31:
        raise SpdnnError(f"layer too large for the csr4 kernel ({first[-1]} padded entries)")
    dest = np.arange(layer.nnz, dtype=np.int64) + np.repeat(first[:-1] - layer.indptr[:-1], deg)
    indices = np.zeros(max(int(first[-1]), 8), dtype=np.uint16)
    indices[dest] = layer.indices
    spans = np.stack([first[:-1], deg], axis=1).astype(np.int32)
    if layer.values is None:
        values = np.zeros(1, dtype=np.float32)
    else:
        values = np.zeros(len(indices), dtype=np.float32)
        values[dest] = layer.values
    return xp.asarray(spans), xp.asarray(indices), xp.asarray(values)


def locality_order(rows: np.ndarray) -> np.ndarray:
    """Stable order of outputs by their first three inputs, so a warp's neighbouring
    outputs gather the same lines and hit in L1. ``rows``: (n_out, degree), sorted."""
    n_out = rows.shape[0]
    key = np.zeros(n_out, dtype=np.uint64)
    for c in range(min(3, rows.shape[1])):
        key <<= np.uint64(16)
        key |= rows[:, c].astype(np.uint64)
    return np.argsort(key, kind="stable")


def ell_layout(layer: Layer, xp=np) -> tuple:
    """(indices, out_ids) the ELL kernels read: slot s computes output out_ids[s]
    from the ``degree`` 16-bit indices at ``indices[s * degree:]`` (CSR order
    within the output, slots in ``locality_order``). ``xp`` is the array
    module of the result: with CuPy the rows are permuted on the device."""
    d = layer.row_degree
    rows = np.ascontiguousarray(layer.indices, dtype=np.uint16).reshape(layer.n_out, d)
    order = locality_order(rows).astype(np.int32)
    out_ids = xp.asarray(order)
    return xp.asarray(rows)[out_ids].reshape(-1), out_ids
