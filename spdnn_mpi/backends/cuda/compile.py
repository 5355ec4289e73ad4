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


def plan_kernel_names(plans: Sequence[lay.LayerPlan]) -> set[str]:
    """The instantiations ``plans`` launch: each plan's kernel, an ELL plan's forms for
    rows held in one tile too."""
    names = set()
    for plan in plans:
        names.add(plan.kernel)
        if plan.is_ell:
            names.update(lay.ell_kernel(plan.kind, plan.degree, rows) for rows in lay.ELL_ROWS)
    return names


def reads_input_bits(plans: Sequence[lay.LayerPlan]) -> bool:
    """Whether the first layer reads binary inputs as bits: the shared-sum grouped
    kernel does (``layer_group_sum``, cuda/spdnn_groups.cu), the others read floats."""
    return bool(plans) and plans[0].is_shared_sum


def kernel_names(plans: Sequence[lay.LayerPlan], held: Sequence | None = None) -> list[str]:
    """The instantiations these plans can launch, and no others: NVRTC's time grows
    with each one (all 24 forms of degree 32 took 2.3x the time of the 7 a challenge
    network then needed, nvcc for sm_90). With ``held``, the layers of the plans on a
    device that runs converged layers in one launch, the one-launch forms of those
    that run in it (``held.py``) too. The kernel a grouped layer falls back to where
    its groups are too sparse is not among them: that is known only once laid out
    (``fallback_names``)."""
    names = {"scatter_rows<u16>", "scatter_rows<int>"} | plan_kernel_names(plans)
    if reads_input_bits(plans):
        names |= {"scatter_bits<u16>", "scatter_bits<int>"}
    if held is not None:
        names |= held_layers.kernel_names(plans, held)
    return sorted(names)


def fallback_names(fallen: Sequence[lay.LayerPlan], compiled: Sequence[str]) -> list[str]:
    """The instantiations the fallen-back plans of grouped layers (``fallen``) need
    beyond ``compiled``."""
    return sorted(plan_kernel_names(fallen) - set(compiled))


class KernelModules:
    """The network's compiled modules as one: a template instantiation comes from the
    module compiled with it, any other kernel from the first module."""

    def __init__(self, module: Any, names: Sequence[str]) -> None:
        self._parts = [(module, frozenset(names))]

    def add(self, module: Any, names: Sequence[str]) -> None:
        """A module compiled with ``names`` (the same program, other instantiations)."""
        self._parts.append((module, frozenset(names)))

    def get_function(self, name: str) -> Any:
        for module, names in self._parts:
            if "<" not in name or name in names:
                return module.get_function(name)
        raise KeyError(f"{name} was not among the instantiations compiled")
