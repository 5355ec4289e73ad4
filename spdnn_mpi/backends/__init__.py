"""Compute backends behind the engine's small interface (``backends.base.Backend``);
``make_backend`` is the one place that builds one."""

from __future__ import annotations

import importlib
import inspect

from spdnn_mpi.backends.base import Backend
from spdnn_mpi.errors import SpdnnError

#: name -> (module, class)
BACKENDS = {
    "cpu": ("spdnn_mpi.backends.cpu.backend", "CpuBackend"),
    "cuda": ("spdnn_mpi.backends.cuda.backend", "CudaBackend"),
    "reference": ("spdnn_mpi.backends.reference", "ReferenceBackend"),
}


def cuda_available() -> tuple[bool, str]:
    """(usable, reason): whether CuPy imports and sees at least one GPU."""
    try:
        import cupy
    except ImportError as exc:
        if exc.name == "cupy":
            return False, "CuPy is not installed"
        return False, f"CuPy cannot be imported: {exc}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing or broken
        return False, f"no usable CUDA device ({exc})"
    if count < 1:
        return False, "no CUDA device visible"
    return True, f"{count} CUDA device(s) visible"


def resolve_backend_name(name: str) -> tuple[str, str]:
    """Map ``auto`` to ``cuda`` or ``cpu``; return (name, why)."""
    if name != "auto":
        if name not in BACKENDS:
            raise SpdnnError(f"unknown backend {name!r}; choose from auto, {', '.join(BACKENDS)}")
        return name, "asked for"
    ok, why = cuda_available()
    return ("cuda", f"auto: {why}") if ok else ("cpu", f"auto: no GPU, {why}")


def make_backend(name: str, **options) -> Backend:
    """Build the backend called ``name`` (after ``resolve_backend_name``); an option
    its constructor does not take is an error, not silently ignored."""
    module_name, class_name = BACKENDS[name]
    cls = getattr(importlib.import_module(module_name), class_name)
    known = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise SpdnnError(f"backend {name} has no option {', '.join(map(repr, unknown))} "
                         f"(it takes: {', '.join(known) or 'none'})")
    return cls(**options)
