"""Where numba keeps the compiled kernels on disk, so each process does not compile again.

Every kernel is ``@njit(cache=True)``. numba writes its cache beside the
source (``__pycache__``) when that is writable: a checkout or a user install.
An install into a read-only prefix (system site-packages, a container, a
shared cluster module) cannot be written there, so ``configure`` points numba
at ``<spdnn cache>/numba`` instead (``$SPDNN_CACHE_DIR``, else
``$XDG_CACHE_HOME/spdnn_mpi``, else ``~/.cache/spdnn_mpi``), or at a per-user
folder in the temp dir when that is not writable either. ``NUMBA_CACHE_DIR``,
when set, always wins. numba writes cache files to a temporary name and
renames them, so many ranks may fill one cache at once.
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

    Call before the module's ``@njit(cache=True)`` functions are defined: numba
    picks the cache location when it decorates them.
    """
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
