"""The grouped kernel's layout built on the device (GPU) against the host reference
``layout.group_layouts``: the same groups, slot for slot (both sorts are stable)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import block_layer, fixed_degree_layer


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("n_in,n_out,degree,max_group,n_layers", [
    (300, 203, 32, 16, 3),     # odd widths, groups of up to 16
    (5000, 77, 8, 40, 2),      # runs longer than 16: split into several groups
    (64, 1000, 64, 3, 1),      # small groups: sparse fill
    (2000, 1100, 16, 40, 4),   # more outputs than a block walks at once (512)
    (65535, 40, 32, 1, 2),     # inputs up to the 16-bit limit, no two outputs alike
])
def test_device_groups_equal_the_hosts(n_in, n_out, degree, max_group, n_layers, values):
    import cupy as cp

    from spdnn_mpi.backends.cuda import layout as lay
    from spdnn_mpi.backends.cuda.compile import module_and_whether_compiled
    from spdnn_mpi.backends.cuda.config import KernelConfig
    from spdnn_mpi.backends.cuda.grouping import device_group_layouts

    rng = np.random.default_rng(n_out + degree + n_layers)
    layers = [block_layer(rng, n_in, n_out, degree, values=values, max_group=max_group)
              for _ in range(n_layers)]
    if not values:  # and a layer where every output reads its own inputs
        layers.append(fixed_degree_layer(rng, n_in, n_out, degree))
    module, _ = module_and_whether_compiled(0, ["scatter_rows<u16>"], KernelConfig())
    got = device_group_layouts(cp, module, layers, sms=8)
    want = lay.group_layouts(layers)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.n_groups, g.wstride, g.fill) == (w.n_groups, w.wstride, w.fill)
        for name in ("indices", "out_ids", "weights"):
            np.testing.assert_array_equal(getattr(g, name).get(), getattr(w, name),
                                          err_msg=name)


def test_a_network_laid_out_on_the_device_matches_the_reference():
    """The challenge's shape end to end: RadiX-Net layers grouped on the device."""
    from spdnn_mpi.engine import run_inference
    from spdnn_mpi.generators.radixnet import radixnet_network
    from spdnn_mpi.model import SparseRows

    from .gpu_helpers import assert_matches_reference, cuda_backend

    net = radixnet_network(1024, 6)
    rng = np.random.default_rng(5)
    rows = SparseRows.from_dense((rng.random((300, 1024)) < 0.1).astype(np.float32))
    backend = cuda_backend()
    backend.load_network(net.layers)
    assert backend.describe()["kernels"] == {"group": 6}
    assert_matches_reference(net, rows, run_inference(net, rows, backend, want_features=True))
