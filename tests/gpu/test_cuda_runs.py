"""Layers over every tile in one launch (``layers_run_grid``, GPU tests): bit for bit
the layer-by-layer kernels' results in direct and compressed mode (and their live
counts in direct mode), where rows die inside a run, settle, or are never dropped;
the reference agrees."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import block_layer, random_inputs

from spdnn_mpi.check_policy import CheckCosts
from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Network

from .gpu_helpers import assert_matches_reference, cuda_backend


def _network(rng, widths, degree, bias, n_layers=24):
    layers = []
    for k in range(n_layers):
        n_in, n_out = widths[k % len(widths)], widths[(k + 1) % len(widths)]
        layer = block_layer(rng, n_in, n_out, degree, values=False, min_group=16,
                            bias=0.0 if bias == "vector" else bias, clip=32.0)
        if bias == "vector":  # some outputs positive: no row is ever dropped
            layer.bias = rng.uniform(-0.3, 0.02, n_out).astype(np.float32)
        layers.append(layer)
    return Network(layers)


@pytest.mark.parametrize("widths,degree,bias,n_rows,batch,graphs", [
    ("1024", 32, -0.22, 3000, None, True),  # 3000 rows, 2545 .. 335 die in the runs
    ("1024", 32, -0.21, 3000, 1100, True),  # in three batches, the last a partial tile
    ("1024", 32, -0.25, 3000, None, False),  # most die in the first run; graphs off
    ("1024/512", 32, -0.2, 1000, None, True),  # widths alternate: other group counts
    ("2048", 32, -0.2, 1500, None, True),
    ("2048", 16, "vector", 700, None, True),  # per-output biases: rows never dropped
    ("4096", 32, -0.22, 1000, None, True),
    ("1024", 32, 0.0, 50, None, True),  # two tiles, the second partial
])
def test_layers_over_every_tile_in_one_launch_equal_layer_by_layer(
        monkeypatch, widths, degree, bias, n_rows, batch, graphs):
    from spdnn_mpi.backends.cuda import held

    monkeypatch.setattr(held, "RUN_FIRST_LAYER", 2)
    monkeypatch.setattr(held, "RUN_MAX_LAYERS", 5)
    widths = [int(w) for w in widths.split("/")]
    rng = np.random.default_rng(widths[-1] + degree)
    net = _network(rng, widths, degree, bias)
    rows = random_inputs(rng, n_rows, widths[0], 0.2 if degree == 32 else 0.1)
    out = {}
    for mode in ("off", "auto"):
        for runs in (True, False):
            backend = cuda_backend(graphs=graphs)
            backend.check_costs = CheckCosts()  # free checks: every due checkpoint merges
            backend.load_network(net.layers)
            queue = backend._queue
            if queue._held is None:
                pytest.skip("layers in one launch need compute capability 9.0")
            assert queue._held._run_kernels  # the run form was compiled
            if not runs:
                queue._held = None
            out[mode, runs] = run_inference(net, rows, backend, batch=batch,
                                            want_features=True, compress=mode)
    fused = out["off", True]
    for other in out.values():
        np.testing.assert_array_equal(other.alive_ids, fused.alive_ids)
        np.testing.assert_array_equal(other.features.view(np.uint32),
                                      fused.features.view(np.uint32))
    # direct mode: the same rows every layer; compressed, the checks may differ (a run
    # compacts only at its end, and a check's gain counts the dead rows it merges)
    np.testing.assert_array_equal(fused.live_per_layer, out["off", False].live_per_layer)
    assert_matches_reference(net, rows, fused)
