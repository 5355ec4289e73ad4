"""Every layer of a small network in one launch (GPU): the same ids, features (bit for
bit) and live counts as one layer a launch, on pruned-like and random networks of
odd widths, 1 to 4 layers, rows that die and rows that do not, batches from a few
rows to one wave of blocks. The kernel is checked past the edge rule
(``whole.MAX_EDGES`` raised), which is a matter of speed, not of the bits."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_inputs, random_network

from spdnn_mpi.backends.cuda import whole
from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Network

from .gpu_helpers import assert_matches_reference, cuda_backend
from .test_cuda_models import _pruned_like_layer


@pytest.fixture(autouse=True)
def _any_edges(monkeypatch):
    monkeypatch.setattr(whole, "MAX_EDGES", 1 << 40)


def _wave_rows():
    """Most rows one launch takes on this card (a block for each 8)."""
    rng = np.random.default_rng(0)
    backend = cuda_backend()
    backend.load_network([_pruned_like_layer(rng, 64, 10, True, np.zeros(10, np.float32))])
    return backend._network.whole.max_rows


def _both(net, rows, **kw):
    """(one launch, a layer a launch): results of two backends on ``net``."""
    out = []
    for one_launch in (True, False):
        backend = cuda_backend(**kw)
        backend.load_network(net.layers)
        if one_launch:
            assert backend._network.whole is not None
        else:
            backend._queue._whole = None
        res = run_inference(net, rows, backend, want_features=True)
        out.append(res)
        # a second batch on the same backend (graph replayed, counts set back) agrees
        again = run_inference(net, rows, backend, want_features=True)
        np.testing.assert_array_equal(again.features, res.features)
        np.testing.assert_array_equal(again.live_per_layer, res.live_per_layer)
    return out


def _same(a, b):
    np.testing.assert_array_equal(a.alive_ids, b.alive_ids)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.live_per_layer, b.live_per_layer)


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("widths", [[300, 1027, 10], [784, 1024, 1024, 10], [3000, 203, 2100],
                                    [100, 200, 150, 300, 10], [57, 33]])
@pytest.mark.parametrize("n_rows", [1000, 37, "wave"])
def test_one_launch_gives_the_bits_of_a_layer_a_launch(widths, values, n_rows):
    n_rows = _wave_rows() if n_rows == "wave" else n_rows
    rng = np.random.default_rng(sum(widths) + values + n_rows)
    layers = [_pruned_like_layer(rng, n_in, n_out, values,
                                 rng.uniform(-0.3, 0.3, n_out).astype(np.float32))
              for n_in, n_out in zip(widths[:-1], widths[1:])]
    layers[-1].activation = "none"
    net = Network(layers)
    rows = random_inputs(rng, n_rows, widths[0], 0.3, binary=False)
    one, per_layer = _both(net, rows)
    # no per-layer times from one launch (one layer: the launch is the layer)
    assert (one.layer_seconds is None) == (len(layers) > 1)
    assert_matches_reference(net, rows, one)
    _same(one, per_layer)


@pytest.mark.parametrize("seed", range(3))
def test_rows_that_die_on_the_way_are_dropped_alike(seed):
    """Negative biases and a clip: rows die at each layer (the engine drops them one
    layer a launch and compacts; one launch computes them as zeros)."""
    rng = np.random.default_rng(40 + seed)
    widths = [int(x) for x in rng.integers(40, 700, 4)]
    net = random_network(rng, widths, 0.15, bias="vector", clip=32.0,
                         activations=["relu", "relu", "relu"])
    for layer, shift in zip(net.layers, (4.0, 30.0, 30.0)):
        layer.bias = layer.bias - np.float32(shift)  # rows die at each layer
    rows = random_inputs(rng, 1000, widths[0], 0.2, binary=True)
    one, per_layer = _both(net, rows, variant="global")
    assert_matches_reference(net, rows, one)
    _same(one, per_layer)
    assert per_layer.live_per_layer[-1] < per_layer.live_per_layer[0]  # rows did die


def test_too_wide_or_too_many_rows_run_a_layer_a_launch():
    rng = np.random.default_rng(3)
    wide = Network([_pruned_like_layer(rng, 4000, 50, True, np.full(50, 0.1, np.float32))])
    backend = cuda_backend()
    backend.load_network(wide.layers)
    assert backend._network.whole is None  # two rows of 8 of 4000 do not fit
    net = Network([_pruned_like_layer(rng, 64, 64, True, np.full(64, 0.1, np.float32)),
                   _pruned_like_layer(rng, 64, 10, True, np.zeros(10, np.float32))])
    backend = cuda_backend()
    backend.load_network(net.layers)
    rows = random_inputs(rng, backend._network.whole.max_rows + 1, 64, 0.3, binary=False)
    res = run_inference(net, rows, backend, want_features=True)
    assert res.layer_seconds is not None  # per-layer stamps: a layer a launch
    assert_matches_reference(net, rows, res)
