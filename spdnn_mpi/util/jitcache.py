"""Where numba keeps the compiled kernels on disk, so each process does not compile again.

Beside the source when writable, else ``<spdnn cache>/numba``, else a per-user
folder in the temp dir; ``NUMBA_CACHE_DIR``, when set, wins. numba renames its
cache files into place, so many ranks may fill one cache at once.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _writable_dir(path: Path) -> bool:
    """True when ``path`` exists or can be made, and a file can be created in it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
        return True
    except OSError:
        return False


def default_cache_dir() -> Path:
    """The numba cache used when the package folder is read-only."""
    from spdnn_mpi.util.paths import cache_dir

    preferred = cache_dir() / "numba"
    if _writable_dir(preferred):
        return preferred
    return Path(tempfile.gettempdir()) / f"spdnn_mpi-numba-{os.getuid()}"


def configure(module_file: str) -> str:
    """Make numba able to cache the kernels of ``module_file``; returns the cache folder.
    Call before the module's ``@njit(cache=True)`` functions are defined."""
    from numba.core import config

    if os.environ.get("NUMBA_CACHE_DIR"):
        return config.CACHE_DIR or os.environ["NUMBA_CACHE_DIR"]
    if config.CACHE_DIR:  # set by an earlier call (or by the user in-process)
        return config.CACHE_DIR
    beside = Path(module_file).resolve().parent / "__pycache__"
    if _writable_dir(beside):
        return str(beside)
    config.CACHE_DIR = str(default_cache_dir())
    return config.CACHE_DIR
