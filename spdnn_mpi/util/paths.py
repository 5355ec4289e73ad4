"""Where spdnn_mpi keeps what it makes for the user: generated stores, compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SPDNN_CACHE_DIR, else $XDG_CACHE_HOME/spdnn_mpi, else ~/.cache/spdnn_mpi."""
    if os.environ.get("SPDNN_CACHE_DIR"):
        return Path(os.environ["SPDNN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "spdnn_mpi"


def cupy_cache_dir() -> Path:
    """The folder CuPy's documentation names for its kernel cache: ``CUPY_CACHE_DIR``,
    else ``~/.cupy/kernel_cache`` (where CuPy itself does not say)."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or "~/.cupy/kernel_cache").expanduser()
