"""Compiling the CUDA kernels: CuPy on demand, NVRTC settings, instantiations.

Kept apart from ``cuda.py`` (the backend) so the peers and the driver can ask
for CuPy with its install hint without loading the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.errors import SpdnnError

#: Compile-time settings handed to NVRTC as #defines.
DEFAULT_DEFINES: dict[str, int] = {
    "SPDNN_SMEM_THREADS": 512,
    "SPDNN_GLOBAL_THREADS": 256,
    "SPDNN_ELL_BATCH": 8,
    "SPDNN_FEW_BATCH": 32,
    "SPDNN_CSR_WARP_OUTPUTS": 8,
    "SPDNN_CSR_ITEMS_PER_BLOCK": 1,
    "SPDNN_COMPACT_DIV": 10,
    "SPDNN_GROUP_THREADS": 256,
    # 8 slots a lane at 3 blocks an SM (80 registers): 6 % faster than 16 slots at 2
    # blocks at N = 1024, equal at 4096 and 65536 (H200, docs/performance.md)
    "SPDNN_GROUP_LANE_SLOTS": 8,
    "SPDNN_GROUP_MIN_BLOCKS": 3,
    "SPDNN_GROUP_BATCH": 8,
    # uniform grouped layers (layer_group_sum): all 32 input loads of a lane issued at
    # once at 2 blocks an SM (128 registers): 100-110 TE/s against 90-100 with 8 loads
    # at 4 blocks at L = 120 (H200)
    "SPDNN_GSUM_MIN_BLOCKS": 2,
    "SPDNN_GSUM_BATCH": 32,
    # the L1/L2 CSR4 kernel's chunks whose gathers are issued together: the 10-output
    # head of the 90 % MNIST model at 1000 digits 9.2 against 12.8 us (H100)
    "SPDNN_CSR4_GROUP": 4,
    # blocks an SM the L1/L2 CSR4 kernel is compiled for (1: no register cap)
    "SPDNN_CSR4_MIN_BLOCKS": 1,
}
#: Warp steps a warp of the plain grouped kernel takes in a row (a kernel argument; 1
#: measured best on the H200: the warps then cover about two tiles, which stay in L2).
GROUP_CHUNK = 1


def parse_defines(items: Sequence[str]) -> dict[str, int]:
    """``["NAME=INT", ...]`` (the tools' --define, the harness's VARIANT:NAME=INT,...)
    as #defines over the defaults; ValueError naming the item that is not NAME=INT."""
    defines = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.lstrip("-").isdigit():
            raise ValueError(f"{item!r}: expected NAME=INT")
        defines[name] = int(value)
    return defines


#: Compiled modules, memoised by (device id, source digest).
_MODULES: dict[tuple[int, str], Any] = {}


def import_cupy():
    """CuPy, or a clear error saying how to get it."""
    try:
        import cupy
    except ImportError as exc:
        raise SpdnnError(
            "CuPy is not installed: the cuda backend needs it "
            "(pip install 'spdnn_mpi[cuda]' for CUDA 13, 'spdnn_mpi[cuda12]' for CUDA 12)"
        ) from exc
    return cupy


def compiled_module(device_id: int, names: Sequence[str], defines: dict[str, int]):
    """The NVRTC-compiled kernel module for this device, compiled once per process."""
    cupy = import_cupy()
    names = tuple(sorted(set(names)))
    source = lay.assemble_source(defines)
    key = (device_id, lay.source_digest(source, names))
    mod = _MODULES.get(key)
    if mod is None:
        with cupy.cuda.Device(device_id):
            mod = cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=names)
            mod.compile()
        _MODULES[key] = mod
    return mod


def kernel_names(degrees: set[int]) -> list[str]:
    """Every instantiation for these degrees (plus 32), so one module serves most networks."""
    names = ["scatter_rows<u16>", "scatter_rows<int>"]
    for d in sorted(degrees | {32}):
        names += [lay.ell_kernel(kind, d, rows) for kind in lay.ELL_KINDS
                  for rows in (0, *lay.ELL_ROWS)]
    names += [f"{kern}<{d}>" for d in sorted(degrees | {32})
              for kern in ("layer_group", "layer_group_sum")]
    for smem in ("true", "false"):
        for vals in ("true", "false"):
            names.append(f"layer_csr4<{smem},{vals}>")
            for itype in ("u16", "int"):
                names.append(f"layer_csr<{smem},{vals},{itype}>")
    return names
