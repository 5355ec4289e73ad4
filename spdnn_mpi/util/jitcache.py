"""Where numba keeps the compiled kernels on disk, so each process does not compile again.

Beside the source when writable, else ``<spdnn cache>/numba``, else a per-user
folder in the temp dir; ``NUMBA_CACHE_DIR``, when set, wins. numba renames its
cache files into place, so many ranks may fill one cache at once.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

#: The module numba imports once, to learn whether ``np.dot`` can call a BLAS.
BLAS_PROBE = "scipy.linalg.cython_blas"


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


def skip_blas_probe() -> None:
    """Import numba's array functions without their probe for a BLAS.

    The probe imports ``scipy.linalg`` (0.1-0.25 s of each process that loads our kernels,
    which call no BLAS); made to fail, it leaves ``np.dot`` and ``np.linalg`` out of
    njit code. Nothing changes where numba's array functions or SciPy's BLAS are
    already imported, and ``scipy.linalg`` imports normally afterwards.
    """
    if "numba.np.arraymath" in sys.modules or BLAS_PROBE in sys.modules:
        return
    sys.modules[BLAS_PROBE] = None  # an import of it now raises ImportError
    try:
        import numba.np.arraymath  # noqa: F401 - imported for its one-time probe
    finally:
        del sys.modules[BLAS_PROBE]


def configure(module_file: str) -> str:
    """Make numba able to cache the kernels of ``module_file``; returns the cache folder.
    Call before the module's ``@njit(cache=True)`` functions are defined. Every kernel
    module calls this first, so it also imports numba's array functions without their
    BLAS probe (``skip_blas_probe``)."""
    from numba.core import config

    skip_blas_probe()

    if os.environ.get("NUMBA_CACHE_DIR"):
        return config.CACHE_DIR or os.environ["NUMBA_CACHE_DIR"]
    if config.CACHE_DIR:  # set by an earlier call (or by the user in-process)
        return config.CACHE_DIR
    beside = Path(module_file).resolve().parent / "__pycache__"
    if _writable_dir(beside):
        return str(beside)
    config.CACHE_DIR = str(default_cache_dir())
    return config.CACHE_DIR
