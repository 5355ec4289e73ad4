"""Every test in tests/gpu is marked ``gpu`` and skipped, with the reason, where
CuPy or a CUDA device is missing (the one place that decides it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .gpu_helpers import cuda_status

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        ok, why = cuda_status()
        if not ok:
            item.add_marker(pytest.mark.skip(reason=why))
