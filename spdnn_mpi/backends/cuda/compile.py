"""Compiling the CUDA kernels: CuPy on demand, the NVRTC module, instantiations
(apart from the backend, so the peers and the driver can import CuPy without it)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from spdnn_mpi.backends.cuda import held as held_layers
from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Layer

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


def module_and_whether_compiled(device_id: int, names: Sequence[str],
                                config: KernelConfig) -> tuple[Any, bool]:
    """The kernel module for this device and settings, loaded once per process, and
    whether NVRTC ran for it (False: this process or CuPy's disk cache had it)."""
    cupy = import_cupy()
    names = tuple(sorted(set(names)))
    source = lay.assemble_source(config)
    key = (device_id, lay.source_digest(source, names))
    mod = _MODULES.get(key)
    if mod is not None:
        return mod, False
    before = _cache_files(cupy)
    with cupy.cuda.Device(device_id):
        mod = cupy.RawModule(code=source, options=("-std=c++17",), name_expressions=names)
        mod.compile()
    _MODULES[key] = mod
    return mod, _cache_files(cupy) != before


def _cache_dir(cupy) -> str:
    """CuPy's kernel cache folder: its own answer where it gives one, else the folder
    its documentation names (``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``)."""
    from spdnn_mpi.util.paths import cupy_cache_dir

    try:
        return cupy.cuda.compiler.get_cache_dir()
    except AttributeError:  # no such function in this CuPy
        return str(cupy_cache_dir())


def _cache_files(cupy) -> frozenset[str]:
    """Files in CuPy's kernel cache folder and below it (empty where it cannot be
    listed): a compile adds one."""
    root = _cache_dir(cupy)
    return frozenset(os.path.relpath(os.path.join(top, name), root)
                     for top, _dirs, names in os.walk(root) for name in names)


def kernel_names(layers: Sequence[Layer], plans: Sequence[lay.LayerPlan], smem_limit: int,
                 variant: str, held: bool = False) -> list[str]:
    """The instantiations these layers' plans can launch, and no others: NVRTC's time
    grows with each one (all 24 forms of degree 32 took 2.3x the time of the 7 a
    challenge network needs, nvcc for sm_90). A grouped layer also gets the kernel
    ``auto`` falls back to where its groups are too sparse (known only once laid out),
    an ELL layer its forms for rows held in one tile; with ``held`` (a device that
    launches clusters) the converged layers' one-launch forms (``held.py``)."""

    names = {"scatter_rows<u16>", "scatter_rows<int>"}
    for layer, plan in zip(layers, plans):
        forms = [plan]
        if plan.kind == "group" and variant == "auto":
            forms.append(lay.plan_layer(layer, smem_limit, variant, grouped=False))
        for form in forms:
            names.add(form.kernel)
            if form.is_ell:
                names.update(lay.ell_kernel(form.kind, form.degree, rows)
                             for rows in lay.ELL_ROWS)
    if held:
        names |= held_layers.kernel_names(plans)
    return sorted(names)
