"""Host side of the CUDA backend that needs no GPU: kernel sources and layouts.

Kept apart from ``cuda.py`` so CPU-only machines (CI) can test that the
kernel sources are found, both in a source checkout (``<repo>/cuda``) and in
a regular install (package ``spdnn_mpi.kernels``), and that the device
layouts are built right.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Layer

#: The kernel sources, compiled together as one NVRTC program.
KERNEL_HEADERS = ("spdnn_common.cuh",)
KERNEL_UNITS = ("spdnn_layers.cu", "spdnn_rows.cu")

#: Rows per feature tile (one warp, one lane per row).
TILE_ROWS = 32

_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$", re.MULTILINE)
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def kernel_source_dir():
    """Folder (Path or importlib Traversable) holding the ``.cu``/``.cuh`` files.

    A source checkout keeps them in ``<repo>/cuda``; an installed package maps
    that folder to ``spdnn_mpi.kernels`` (setup.cfg ``package_dir``).
    """
    checkout = Path(__file__).resolve().parents[2] / "cuda"
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


def read_kernel_file(name: str) -> str:
    """Text of one kernel source file."""
    return kernel_source_dir().joinpath(name).read_text(encoding="utf-8")


def assemble_source(defines: dict[str, int | float] | None = None) -> str:
    """One self-contained program: ``#define`` block, then every unit with its
    local ``#include "..."`` lines inlined once (NVRTC then needs no include path)."""
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return f"// {name} already included\n"
        seen.add(name)
        text = _PRAGMA_ONCE.sub("", read_kernel_file(name))
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    head = "".join(f"#define {k} {v}\n" for k, v in sorted((defines or {}).items()))
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

    kind: str  # "smem32", "smem8", "global", "l1", "csr_smem", "csr_global"
    kernel: str  # NVRTC name expression
    degree: int  # inputs per output (ELL kinds), 0 for CSR
    rows_per_unit: int  # rows a block stages (ELL smem kinds), 32 otherwise
    smem_bytes: int  # dynamic shared memory per block
    n_slices: int  # ELL: output groups of 32/rows_per_unit outputs


def plan_layer(layer: Layer, smem_limit: int, variant: str = "auto") -> LayerPlan:
    """Pick the kernel for ``layer`` given the per-block shared memory limit.

    Uniform weights with a fixed degree (a multiple of 8, at most 64) and
    16-bit indices take the ELL kernels: the whole 32-row tile in shared
    memory when it fits (``smem32``), else the L1/L2 kernel (``global``);
    ``variant`` forces one of those, the 8-row slice (``smem8``) or the
    per-SM scheduled L1 kernel (``l1``) where it applies.
    Everything else takes the CSR kernel.
    """
    d = layer.row_degree
    ell_ok = (
        layer.values is None
        and d is not None
        and d % 8 == 0
        and 8 <= d <= 64
        and layer.n_in <= 65536
        and np.dtype(layer.indices.dtype) == np.uint16
    )
    fits32 = layer.n_in * 32 * 4 <= smem_limit
    fits8 = layer.n_in * 8 * 4 <= smem_limit
    if ell_ok and variant != "csr":
        if variant == "auto":
            # Measured on the H200 (docs/performance.md): the staged 32-row tile
            # wins where it fits; beyond it the L1/L2 kernel beats the 8-row slice.
            kind = "smem32" if fits32 else "global"
        elif variant == "l1":
            kind = "l1"
        elif variant == "smem32":
            kind = "smem32" if fits32 else ("smem8" if fits8 else "global")
        elif variant == "smem8":
            kind = "smem8" if fits8 else "global"
        elif variant == "global":
            kind = "global"
        else:
            raise SpdnnError(f"unknown CUDA kernel variant {variant!r}")
        if kind in ("global", "l1"):
            name = "layer_ell_global" if kind == "global" else "layer_ell_l1"
            return LayerPlan(kind, f"{name}<{d}>", d, 32, 0, layer.n_out)
        t = 32 if kind == "smem32" else 8
        g = 32 // t
        return LayerPlan(
            kind, f"layer_ell_smem<{t},{d}>", d, t, layer.n_in * t * 4, -(-layer.n_out // g)
        )
    vals = "true" if layer.values is not None else "false"
    itype = "u16" if np.dtype(layer.indices.dtype) == np.uint16 else "int"
    if fits32:
        return LayerPlan("csr_smem", f"layer_csr<true,{vals},{itype}>", 0, 32,
                         layer.n_in * 32 * 4, 0)
    return LayerPlan("csr_global", f"layer_csr<false,{vals},{itype}>", 0, 32, 0, 0)


def ell_indices(layer: Layer, plan: LayerPlan) -> np.ndarray:
    """16-bit indices in the sliced layout the ELL kernels read.

    Outputs are grouped by ``g = 32 / rows_per_unit`` (padded with index 0);
    within a group the 8-index vectors are interleaved, ``[slice][q][g][8]``,
    so the ``g`` lane groups of a warp read one contiguous run of 16*g bytes.
    For ``g = 1`` that is plain CSR order.
    """
    d = plan.degree
    g = 32 // plan.rows_per_unit
    idx = np.ascontiguousarray(layer.indices, dtype=np.uint16).reshape(layer.n_out, d)
    if g == 1:
        return idx.reshape(-1)
    pad = plan.n_slices * g - layer.n_out
    if pad:
        idx = np.concatenate([idx, np.zeros((pad, d), dtype=np.uint16)])
    sliced = idx.reshape(plan.n_slices, g, d // 8, 8).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(sliced).reshape(-1)


def ell_indices_inverse(flat: np.ndarray, n_out: int, plan: LayerPlan) -> np.ndarray:
    """(n_out, degree) indices back from ``ell_indices`` (used by tests)."""
    d = plan.degree
    g = 32 // plan.rows_per_unit
    arr = np.asarray(flat).reshape(plan.n_slices if g > 1 else n_out, d // 8, g, 8)
    return arr.transpose(0, 2, 1, 3).reshape(-1, d)[:n_out]


def layer_traffic(n: int, degree: int, live_in: int, *, index_bytes: int = 2) -> dict:
    """Bytes and adds one uniform layer must move/do for ``live_in`` rows.

    Weights: n * degree indices read once; features: each live row read once
    and written once (float32). Adds: degree per output per live row.
    """
    weight_bytes = n * degree * index_bytes
    feature_bytes = 2 * 4 * n * live_in
    return {
        "weight_bytes": weight_bytes,
        "feature_bytes": feature_bytes,
        "bytes": weight_bytes + feature_bytes,
        "adds": degree * n * live_in,
    }
