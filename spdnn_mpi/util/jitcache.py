"""Where numba keeps the compiled kernels on disk, so each process does not compile again.

Beside the source when writable, else ``<spdnn cache>/numba``, else a per-user
folder in the temp dir; ``NUMBA_CACHE_DIR``, when set, wins. numba renames its
cache files into place, so many ranks may fill one cache at once.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

#: Modules numba imports only for what our kernels never use, each with the part of
#: numba that imports it: PyYAML to read a ``.numba_config.yaml`` and cffi (with pycparser)
#: to call cffi functions from njit code (together 0.03 s of a 0.4 s start), and
#: ``scipy.linalg`` for a BLAS behind ``np.dot`` and ``np.linalg`` (0.1-0.25 s).
PROBES = {"yaml": "numba.core.config",
          "cffi": "numba.core.typing.cffi_utils",
          "scipy.linalg.cython_blas": "numba.np.arraymath"}
#: The file numba reads its settings from, in the working directory (needs PyYAML).
NUMBA_CONFIG_FILE = ".numba_config.yaml"


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


def skip_probes() -> None:
    """Import the parts of numba that probe for optional modules (``PROBES``) while those
    modules fail to import, and let them import normally again afterwards.

    Our kernels call no BLAS, no cffi function and read no settings file, and the probes
    cost 0.13-0.28 s of every process that loads them. Nothing changes for a probe whose
    module or whose part of numba is already imported, nor for PyYAML where the working
    directory holds a ``.numba_config.yaml``.
    """
    blocked = [probe for probe, importer in PROBES.items()
               if probe not in sys.modules and importer not in sys.modules
               and not (probe == "yaml" and os.path.isfile(NUMBA_CONFIG_FILE))]
    for probe in blocked:
        sys.modules[probe] = None  # an import of it now raises ImportError
    try:
        for probe in blocked:
            importlib.import_module(PROBES[probe])
    finally:
        for probe in blocked:
            del sys.modules[probe]


def load_numba(module_file: str) -> ModuleType:
    """numba, imported without its optional probes (``skip_probes``), and the on-disk
    cache set up for the kernels of ``module_file`` (``configure``). Every kernel module
    calls this before its ``@njit(cache=True)`` functions are defined."""
    skip_probes()
    import numba

    configure(module_file)
    return numba


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
