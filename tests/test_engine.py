"""Fast backends against the plain reference on fresh random networks."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_inputs, random_network, record_cuts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spdnn_mpi.backends import make_backend
from spdnn_mpi.engine import CUT_MIN_LAYERS_LEFT, run_inference
from spdnn_mpi.model import Layer, Network, SparseRows
from spdnn_mpi.reference import forward_dense, reference_infer

FAST_BACKENDS = ["cpu", "reference"]


def check_against_reference(network: Network, rows: SparseRows, backend_name: str,
                            batch: int | None = None) -> None:
    ids, feats = reference_infer(network, rows)
    backend = make_backend(backend_name)
    backend.load_network(network.layers)
    res = run_inference(network, rows, backend, batch=batch, want_features=True)
    np.testing.assert_array_equal(res.alive_ids, ids)
    np.testing.assert_allclose(res.features, feats, rtol=1e-5, atol=1e-5)
    # the no-dropping dense forward pass agrees on who is alive
    full = forward_dense(network, rows.to_dense())
    np.testing.assert_array_equal(np.flatnonzero(full.any(axis=1)) + rows.first_row, ids)


@pytest.mark.parametrize("backend_name", FAST_BACKENDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    widths=st.lists(st.integers(1, 90), min_size=2, max_size=6),
    n_rows=st.integers(0, 150),
    density=st.floats(0.02, 0.5),
    uniform=st.booleans(),
    bias=st.sampled_from(["scalar", "vector", "positive"]),
    clip=st.sampled_from([None, 32.0, 1.5]),
    binary=st.booleans(),
    activations=st.sampled_from(["relu", "mixed"]),
)
def test_random_networks_match_reference(backend_name, seed, widths, n_rows, density, uniform,
                                         bias, clip, binary, activations):
    rng = np.random.default_rng(seed)
    net = random_network(rng, widths, density, uniform=uniform, bias=bias, clip=clip,
                         activations=activations)
    rows = random_inputs(rng, n_rows, widths[0], 0.15, binary)
    check_against_reference(net, rows, backend_name)


@pytest.mark.parametrize("batch", [1, 7, 64, 1000])
def test_batching_gives_identical_results(batch):
    rng = np.random.default_rng(11)
    net = random_network(rng, [64, 64, 64, 64], 0.1, uniform=True)
    rows = random_inputs(rng, 300, 64, 0.2)
    check_against_reference(net, rows, "cpu", batch=batch)


def challenge_like(rng, n=256, layers=12, degree=32):
    """Random regular layers with the challenge's value, bias and clip."""
    out = []
    for _ in range(layers):
        idx = np.stack([rng.choice(n, degree, replace=False) for _ in range(n)])
        indptr = np.arange(0, n * degree + 1, degree, dtype=np.int64)
        out.append(Layer(n, n, indptr, np.sort(idx, axis=1).ravel().astype(np.uint16),
                         None, 1 / 16, -0.3, 32.0))
    return Network(out)


def test_challenge_shaped_categories_exact():
    rng = np.random.default_rng(5)
    net = challenge_like(rng)
    rows = random_inputs(rng, 2000, 256, 0.25)
    ids, _ = reference_infer(net, rows)
    assert 0 < len(ids) < 2000
    backend = make_backend("cpu")
    backend.load_network(net.layers)
    res = run_inference(net, rows, backend)
    np.testing.assert_array_equal(res.alive_ids, ids)
    assert res.live_per_layer[-1] == len(ids)


def test_every_row_dies_at_layer_one():
    rng = np.random.default_rng(3)
    net = random_network(rng, [32, 32, 32], 0.3)
    net.layers[0].bias = -1000.0
    rows = random_inputs(rng, 100, 32, 0.3)
    for name in FAST_BACKENDS:
        backend = make_backend(name)
        backend.load_network(net.layers)
        res = run_inference(net, rows, backend)
        assert len(res.alive_ids) == 0
        assert list(res.live_per_layer) == [0, 0]


def test_no_row_ever_dies():
    rng = np.random.default_rng(4)
    net = random_network(rng, [40, 30, 20], 0.5, bias="positive")
    for layer in net.layers:
        layer.bias = np.abs(layer.bias_vector()) + 0.1
    rows = random_inputs(rng, 77, 40, 0.0)  # all-zero inputs still come alive
    check_against_reference(net, rows, "cpu")
    backend = make_backend("cpu")
    backend.load_network(net.layers)
    assert len(run_inference(net, rows, backend).alive_ids) == 77


def test_single_input_and_empty_slice():
    rng = np.random.default_rng(6)
    net = random_network(rng, [50, 50, 50], 0.3)
    rows = random_inputs(rng, 10, 50, 0.4)
    for part in (rows.slice(3, 4), rows.slice(5, 5)):
        check_against_reference(net, part, "cpu")


def test_global_ids_survive_slicing():
    rng = np.random.default_rng(8)
    net = random_network(rng, [30, 30], 0.3, bias="vector")
    rows = random_inputs(rng, 40, 30, 0.3)
    whole, _ = reference_infer(net, rows)
    backend = make_backend("cpu")
    backend.load_network(net.layers)
    parts = [run_inference(net, rows.slice(a, b), backend).alive_ids
             for a, b in [(0, 13), (13, 13), (13, 40)]]
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_real_network_reference_and_cpu_agree(real_dir):
    """All 120 official layers, MNIST-derived inputs: categories identical."""
    from spdnn_mpi.formats.tsv.tree import iter_layers
    from spdnn_mpi.generators.digits import digit_images

    net = Network(list(iter_layers(real_dir, 1024, 120, bias=-0.3, clip=32.0)))
    rows = digit_images(1024, 3000)
    ids, feats = reference_infer(net, rows)
    assert 0 < len(ids) < rows.n_rows
    backend = make_backend("cpu")
    backend.load_network(net.layers)
    res = run_inference(net, rows, backend, want_features=True)
    np.testing.assert_array_equal(res.alive_ids, ids)
    np.testing.assert_array_equal(res.features, feats)  # 1/16 weights: bit-identical sums


def test_reference_categories_at_several_counts_in_one_pass():
    from spdnn_mpi.reference import reference_categories, reference_categories_at

    rng = np.random.default_rng(12)
    net = challenge_like(rng, n=128, layers=9)
    rows = random_inputs(rng, 1500, 128, 0.3)
    by_count = reference_categories_at(net, rows, [2, 5, 9])
    sizes = [len(by_count[n]) for n in (2, 5, 9)]
    assert sizes[0] > sizes[2] > 0
    for n in (2, 5, 9):
        np.testing.assert_array_equal(by_count[n], reference_categories(net.truncated(n), rows))
    with pytest.raises(ValueError):
        reference_categories_at(net, rows, [10])


@pytest.mark.parametrize("warm_up_rows, expected", [(None, 700), (512, 512), (10, 10)])
def test_warm_up_takes_the_backends_rows(warm_up_rows, expected):
    """The untimed warm-up runs ``warm_up_rows`` rows (None: the whole input,
    so a CUDA graph captured for the batch's size is the one the timed runs use)."""
    from spdnn_mpi.backends.reference import ReferenceBackend
    from spdnn_mpi.engine import time_inference

    class Recording(ReferenceBackend):
        loads: list[int] = []

        def load_features(self, rows, drop_empty):
            self.loads.append(rows.n_rows)
            super().load_features(rows, drop_empty)

    rng = np.random.default_rng(3)
    network = random_network(rng, [20, 20, 20], 0.3, uniform=True)
    rows = random_inputs(rng, 700, 20, 0.3)
    backend = Recording()
    backend.warm_up_rows = warm_up_rows
    backend.load_network(network.layers)
    _median, times, _res = time_inference(network, rows, backend, repeat=2)
    assert backend.loads == [expected, 700, 700]
    assert len(times) == 2


@pytest.mark.parametrize("backend_name", FAST_BACKENDS)
def test_released_buffers_come_back_for_the_next_batch(backend_name):
    """``release_buffers`` (before a peer runs beside us) keeps the network loaded."""
    rng = np.random.default_rng(4)
    network = random_network(rng, [40, 40, 40], 0.2, uniform=True)
    rows = random_inputs(rng, 300, 40, 0.3)
    backend = make_backend(backend_name)
    backend.load_network(network.layers)
    first = run_inference(network, rows, backend, want_features=True)
    backend.release_buffers()
    again = run_inference(network, rows, backend, want_features=True)
    np.testing.assert_array_equal(first.alive_ids, again.alive_ids)
    np.testing.assert_array_equal(first.features, again.features)


@pytest.mark.parametrize("compress", ["off", "auto"])
@pytest.mark.parametrize(("n_layers", "expected"), [(41, [1, 2, 4, 8, 16]), (3, [])])
def test_runs_without_checks_start_their_layers_at_powers_of_two(monkeypatch, compress,
                                                                   n_layers, expected):
    """With no check to come (off, or a network too short for one), the queue is cut
    after 1, 2, 4, ... layers while CUT_MIN_LAYERS_LEFT are left: the device starts
    while the host queues the rest, and a short network keeps its one launch."""
    assert CUT_MIN_LAYERS_LEFT == 16  # the cases above are chosen for it
    rng = np.random.default_rng(3)
    net = random_network(rng, [64] * (n_layers + 1), 0.2)
    rows = random_inputs(rng, 50, 64, 0.3)
    backend = make_backend("cpu")
    backend.load_network(net.layers)
    if compress == "auto":
        backend.check_min_layers_left = net.n_layers  # no checkpoint leaves enough layers
    cuts = record_cuts(monkeypatch, backend)
    res = run_inference(net, rows, backend, compress=compress)
    assert cuts == expected
    np.testing.assert_array_equal(res.alive_ids, reference_infer(net, rows)[0])
