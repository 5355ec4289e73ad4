"""Helpers the GPU tests share: whether a GPU is usable, a CUDA backend, and the
comparison of its results with the scipy reference."""

from __future__ import annotations

import functools

import numpy as np

from spdnn_mpi.engine import run_inference
from spdnn_mpi.reference import reference_infer


@functools.cache
def cuda_status() -> tuple[bool, str]:
    """(usable, reason): ``backends.cuda_available`` after the backend's own CuPy
    import, which also works from a checkout whose cuda/ folder would hide
    NVIDIA's ``cuda`` package."""
    from spdnn_mpi.backends import cuda_available
    from spdnn_mpi.backends.cuda.compile import import_cupy
    from spdnn_mpi.errors import SpdnnError

    try:
        import_cupy()
    except SpdnnError as exc:
        return False, str(exc)
    return cuda_available()


def cuda_backend(**kw):
    """A ``CudaBackend`` with these options."""
    from spdnn_mpi.backends.cuda.backend import CudaBackend

    return CudaBackend(**kw)


def assert_matches_reference(network, rows, res) -> None:
    """Ids exactly the reference's, features within 1e-5 relative (where there are any)."""
    ids, ref = reference_infer(network, rows)
    np.testing.assert_array_equal(res.alive_ids, ids)
    if res.features is not None:
        assert res.features.shape == ref.shape
        if ref.size:
            err = np.linalg.norm(res.features - ref) / max(np.linalg.norm(ref), 1e-30)
            assert err <= 1e-5, err


def check(network, rows, backend=None, *, batch=None, features=True):
    """Run on the GPU (a default backend unless given) and compare with the reference."""
    backend = backend or cuda_backend()
    backend.load_network(network.layers)
    res = run_inference(network, rows, backend, batch=batch, want_features=features)
    assert_matches_reference(network, rows, res)
    return res


def run_cuda(network, rows, variant="auto", **kw):
    """One run on a fresh backend of ``variant``, features included."""
    backend = cuda_backend(variant=variant, **kw)
    backend.load_network(network.layers)
    return run_inference(network, rows, backend, want_features=True)
