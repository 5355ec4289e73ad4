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
KERNEL_UNITS = ("spdnn_layers.cu", "spdnn_rows.cu", "spdnn_merge.cu")

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

    kind: str  # "smem32", "global", "csr_smem", "csr_global"
    kernel: str  # NVRTC name expression
    degree: int  # inputs per output (ELL kinds), 0 for CSR
    smem_bytes: int  # dynamic shared memory per block

    @property
    def is_ell(self) -> bool:
        """Fixed-degree uniform layout (``ell_layout``) rather than CSR."""
        return self.kind in ELL_KINDS


#: Kinds of the fixed-degree kernels, and the variants a user may force.
ELL_KINDS = ("smem32", "global")
#: Rows an ELL kernel computes per tile: all 32, or (one tile of compressed,
#: converged rows held) only the first 16 or 8, reading fewer bytes per input.
ELL_ROWS = (32, 16, 8)


def ell_kernel(kind: str, degree: int, rows: int = 0) -> str:
    """NVRTC name of the ELL kernel of ``kind`` for ``degree`` inputs: the whole-tile
    form (``rows`` 0), or the form for at most ``rows`` rows held in one tile."""
    base = "layer_ell_smem" if kind == "smem32" else "layer_ell_global"
    return f"{base}<{degree},{rows or 32},{'true' if rows else 'false'}>"


def rows_bucket(rows: int) -> int:
    """Fewest rows of ``ELL_ROWS`` that hold ``rows`` (at most one tile)."""
    return min(r for r in ELL_ROWS if r >= rows)
VARIANTS = ("auto", "smem32", "global", "csr")


def check_variant(variant: str) -> None:
    """Refuse a kernel variant this version does not have, naming the ones it has."""
    if variant not in VARIANTS:
        raise SpdnnError(f"unknown CUDA kernel variant {variant!r} (one of {', '.join(VARIANTS)})")


def plan_layer(layer: Layer, smem_limit: int, variant: str = "auto") -> LayerPlan:
    """Pick the kernel for ``layer`` given the per-block shared memory limit.

    Uniform weights with a fixed degree (a multiple of 8, at most 64) and
    16-bit indices take the ELL kernels: the whole 32-row tile in shared
    memory when it fits (``smem32``), else the L1/L2 kernel (``global``);
    ``variant`` forces one of them (``smem32`` only where the tile fits) or
    the CSR kernel. Everything else takes the CSR kernel.
    """
    check_variant(variant)
    d = layer.row_degree
    ell_ok = (
        layer.values is None
        and d is not None
        and d % 8 == 0
        and 8 <= d <= 64
        and layer.n_in <= 65536
        and np.dtype(layer.indices.dtype) == np.uint16
    )
    tile_bytes = layer.n_in * TILE_ROWS * 4
    fits32 = tile_bytes <= smem_limit
    if ell_ok and variant != "csr":
        # Measured on the H200 (docs/performance.md): the staged tile wins where it fits.
        if fits32 and variant in ("auto", "smem32"):
            return LayerPlan("smem32", ell_kernel("smem32", d), d, tile_bytes)
        return LayerPlan("global", ell_kernel("global", d), d, 0)
    vals = "true" if layer.values is not None else "false"
    itype = "u16" if np.dtype(layer.indices.dtype) == np.uint16 else "int"
    if fits32:
        return LayerPlan("csr_smem", f"layer_csr<true,{vals},{itype}>", 0, tile_bytes)
    return LayerPlan("csr_global", f"layer_csr<false,{vals},{itype}>", 0, 0)


def locality_order(rows: np.ndarray) -> np.ndarray:
    """Output order in which outputs that read the same inputs are neighbours.

    ``rows`` is (n_out, degree) of sorted input indices. Sorting by the first
    three indices puts outputs with equal (or overlapping) input sets next to
    each other, so a warp's consecutive outputs gather the same 128-byte lines
    and hit in L1. Every output is still computed from all of its inputs; on a
    matrix without such structure the order only groups outputs by their
    lowest inputs. Stable, so ties keep the natural order.
    """
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
