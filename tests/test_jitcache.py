"""numba's on-disk cache of the kernels: from a read-only install, filled by many processes.

A copy of the package stands in for an installed one whose folders cannot be
written: a plain file named ``__pycache__`` blocks numba's cache beside the
sources (for root as well, where permission bits would not), and the user's
cache folder is blocked the same way. Before ``spdnn_mpi.util.jitcache`` this
import failed ("cannot cache function ... no locator available").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spdnn_mpi.util import jitcache

REPO = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys
import numpy as np
import spdnn_mpi
from spdnn_mpi.backends.cpu import kernels as k
from numba.core import config
tiles = np.ones((3, 4, k.TILE_ROWS), np.float32)
k.first_touch(tiles)
assert not tiles.any()
st = k.first_touch.stats
print(json.dumps({"package": spdnn_mpi.__file__, "cache_dir": config.CACHE_DIR,
                  "hits": sum(st.cache_hits.values()), "misses": sum(st.cache_misses.values())}))
"""


def _read_only_install(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    shutil.copytree(REPO / "spdnn_mpi", site / "spdnn_mpi",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for folder in [site / "spdnn_mpi", *[p for p in (site / "spdnn_mpi").rglob("*") if p.is_dir()]]:
        (folder / "__pycache__").write_text("not a folder: nothing can be cached here\n")
    return site


def _env(tmp_path: Path, site: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "SPDNN_"))}
    blocked = tmp_path / "blocked-cache"
    blocked.write_text("a file where the user's cache folder would be\n")
    env.update(PYTHONPATH=str(site), SPDNN_CACHE_DIR=str(tmp_path / "spdnn-cache"),
               XDG_CACHE_HOME=str(blocked), HOME=str(tmp_path), PYTHONDONTWRITEBYTECODE="1",
               NUMBA_NUM_THREADS="2")
    return env


def test_cache_works_from_read_only_install_with_concurrent_processes(tmp_path):
    site = _read_only_install(tmp_path)
    env = _env(tmp_path, site)
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]  # three "ranks" compiling into one empty cache at once
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    expected_dir = tmp_path / "spdnn-cache" / "numba"
    for r in results:
        assert r["package"].startswith(str(site))
        assert Path(r["cache_dir"]) == expected_dir
    assert list(expected_dir.rglob("*.nbi")) and list(expected_dir.rglob("*.nbc"))
    again = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    later = json.loads(again.stdout.strip().splitlines()[-1])
    assert later["hits"] >= 1 and later["misses"] == 0  # loaded, not compiled again


def test_numba_cache_dir_from_the_environment_wins(monkeypatch, tmp_path):
    from numba.core import config

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "mine"))
    assert jitcache.configure(str(tmp_path / "pkg" / "mod.py")) == str(tmp_path / "mine")


def test_writable_package_folder_keeps_numbas_default(monkeypatch, tmp_path):
    from numba.core import config

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(config, "CACHE_DIR", "")
    (tmp_path / "pkg").mkdir()
    assert jitcache.configure(str(tmp_path / "pkg" / "mod.py")) == str(tmp_path / "pkg" /
                                                                       "__pycache__")
    assert config.CACHE_DIR == ""  # numba's own in-tree cache is used


def test_read_only_package_folder_uses_the_spdnn_cache(monkeypatch, tmp_path):
    from numba.core import config

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("SPDNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(config, "CACHE_DIR", "")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__pycache__").write_text("blocked")
    assert jitcache.configure(str(tmp_path / "pkg" / "mod.py")) == str(tmp_path / "cache" /
                                                                       "numba")


@pytest.mark.parametrize("module", ["spdnn_mpi.backends.cpu.kernels",
                                    "spdnn_mpi.formats.tsv.kernels"])
def test_every_kernel_is_cached_on_disk(module):
    import importlib

    from numba.core.registry import CPUDispatcher

    mod = importlib.import_module(module)
    kernels = [v for v in vars(mod).values() if isinstance(v, CPUDispatcher)]
    assert kernels
    for kernel in kernels:
        assert kernel._cache.__class__.__name__ == "FunctionCache", kernel.__name__


BLAS_PROBE_CHECK = r"""
import sys
from spdnn_mpi.formats.tsv import kernels  # configures the cache, imports numba
print("scipy.linalg" in sys.modules)
import numba.np.arraymath as arraymath
import scipy.linalg
print(arraymath._HAVE_BLAS, scipy.linalg.cython_blas.__name__)
"""


def test_loading_the_kernels_skips_numbas_blas_probe():
    """The kernels' process does not import scipy.linalg for numba's BLAS probe (0.1-0.25 s),
    and scipy.linalg still imports normally afterwards."""
    out = subprocess.run([sys.executable, "-c", BLAS_PROBE_CHECK], cwd=REPO, text=True,
                         capture_output=True, check=True).stdout.split()
    assert out == ["False", "False", "scipy.linalg.cython_blas"]


def test_blas_probe_left_alone_where_scipys_blas_is_loaded():
    """With SciPy's BLAS imported first, numba sees it as usual."""
    code = "import scipy.linalg.cython_blas\n" + BLAS_PROBE_CHECK
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True,
                         capture_output=True, check=True).stdout.split()
    assert out == ["True", "True", "scipy.linalg.cython_blas"]


# Stand-ins for PyYAML and cffi, first on the path: each says so when it is imported.
FAKE_MODULES = {
    "yaml.py": 'print("imported yaml")\ndef safe_load(f):\n    return None\n',
    "cffi.py": 'print("imported cffi")\nclass FFI:\n    pass\n',
}

OPTIONAL_CHECK = r"""
import sys
from spdnn_mpi.formats.tsv import kernels  # imports numba, skipping its optional probes
print("loaded", "yaml" in sys.modules, "cffi" in sys.modules)
from numba.core import config
from numba.core.typing import cffi_utils
print("numba sees", config._HAVE_YAML, cffi_utils.SUPPORTED)
import cffi, yaml  # noqa: E401 - both import as usual afterwards
print("later", cffi.__name__, yaml.__name__)
"""


def _optional_check(tmp_path: Path, config_file: bool) -> list[str]:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    for name, text in FAKE_MODULES.items():
        (fakes / name).write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    if config_file:
        (work / jitcache.NUMBA_CONFIG_FILE).write_text("# no settings\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fakes), str(REPO)]))
    return subprocess.run([sys.executable, "-c", OPTIONAL_CHECK], cwd=work, env=env,
                          text=True, capture_output=True, check=True).stdout.splitlines()


def test_loading_the_kernels_skips_numbas_yaml_and_cffi_probes(tmp_path):
    """numba imports neither a settings file's parser nor cffi when our kernels load it
    (together about 0.03 s); both modules import normally afterwards."""
    assert _optional_check(tmp_path, config_file=False) == [
        "loaded False False", "numba sees False False", "imported cffi", "imported yaml",
        "later cffi yaml"]


def test_yaml_probe_left_alone_where_a_numba_settings_file_is(tmp_path):
    """With a .numba_config.yaml in the working directory numba reads it as usual."""
    out = _optional_check(tmp_path, config_file=True)
    assert out[:3] == ["imported yaml", "loaded True False", "numba sees True False"]
