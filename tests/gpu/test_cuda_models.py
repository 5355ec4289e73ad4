"""CUDA backend on classifiers (GPU): ReLU and linear layers, argmax readout, shipped
models, the CSR4 kernels on pruned-like layers."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_inputs, random_network

from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Layer, Network, SparseRows
from spdnn_mpi.readout import classes_of_rows
from spdnn_mpi.reference import reference_predictions

from .gpu_helpers import assert_matches_reference, cuda_backend, run_cuda


@pytest.mark.parametrize("variant", ["auto", "global", "csr"])
@pytest.mark.parametrize("seed", range(4))
def test_random_classifiers_match_reference(variant, seed):
    rng = np.random.default_rng(100 + seed)
    widths = [int(x) for x in rng.integers(20, 300, 3)] + [10]
    net = random_network(rng, widths, 0.2, bias="positive", clip=None,
                         activations=["relu", "relu", "none"])
    rows = random_inputs(rng, 333, widths[0], 0.3, binary=False)
    res = run_cuda(net, rows, variant)
    assert_matches_reference(net, rows, res)
    ours = classes_of_rows(rows.n_rows, res.alive_ids, res.features)
    np.testing.assert_array_equal(ours, reference_predictions(net, rows))


@pytest.mark.parametrize("variant", ["auto", "group", "smem32", "global", "csr"])
def test_linear_uniform_layers_on_every_kernel(variant):
    """Fixed degree, uniform weights (the ELL kernels), no activation: floor -inf."""
    rng = np.random.default_rng(7)
    n, degree, layers = 256, 16, []
    for k in range(3):
        idx = np.sort(np.stack([rng.choice(n, degree, replace=False) for _ in range(n)]), axis=1)
        indptr = np.arange(0, degree * n + 1, degree, dtype=np.int64)
        bias = rng.uniform(-0.5, 0.2, n).astype(np.float32)
        layers.append(Layer(n, n, indptr, idx.ravel().astype(np.uint16), None, -0.125, bias,
                            None if k < 2 else 4.0, "none" if k != 1 else "relu"))
    net = Network(layers)
    rows = random_inputs(rng, 200, n, 0.2, binary=False)
    assert_matches_reference(net, rows, run_cuda(net, rows, variant))


def test_negative_outputs_are_alive():
    w = -np.eye(40, dtype=np.float32)
    i, j = np.nonzero(w)
    net = Network([Layer.from_coo(i, j, w[i, j], 40, 40, activation="none")])
    dense = np.zeros((70, 40), np.float32)
    dense[::2, 3] = 1.0  # even rows: one negative output; odd rows: all zero
    rows = SparseRows.from_dense(dense)
    res = run_cuda(net, rows)
    np.testing.assert_array_equal(res.alive_ids, np.arange(0, 70, 2))


def test_shipped_models_predict_like_the_reference(tmp_path):
    from spdnn_mpi.formats.store.reader import Store
    from spdnn_mpi.generators import mnist_models as mm

    for entry in [e for e in mm.bundled_models() if e.get("file")]:
        with Store(mm.model_store(entry, tmp_path)) as st:
            net, rows, expected = st.network(), st.inputs(), st.predictions(st.n_layers)
        res = run_cuda(net, rows)
        assert_matches_reference(net, rows, res)
        ours = classes_of_rows(rows.n_rows, res.alive_ids, res.features)
        np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("peer", ["torch_dense_infer", "torch_sparse_mlp_infer"])
def test_torch_model_peers_match_the_reference(peer):
    from spdnn_mpi.bench.peers import torch_models as torch_dense
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.reference import forward_dense

    rng = np.random.default_rng(5)
    net = random_network(rng, [60, 90, 10], 0.3, bias="positive", clip=None,
                         activations=["relu", "none"])
    rows = random_inputs(rng, 150, 60, 0.3, binary=False)
    try:
        out, seconds, times = getattr(torch_dense, peer)(net, rows, batch=64, repeat=2)
    except SpdnnError as exc:
        pytest.skip(str(exc))
    full = forward_dense(net, rows.to_dense())
    np.testing.assert_allclose(out, full, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(np.argmax(out, axis=1), reference_predictions(net, rows))
    assert seconds > 0 and len(times) == 2


def _pruned_like_layer(rng, n_in, n_out, values, bias):
    """Per-output degrees as magnitude pruning leaves them: many outputs empty or
    light, a few 5-10x the mean (up to ``n_in``), so warp steps mix degrees."""
    heavy = rng.random(n_out) < 0.05
    deg = np.where(heavy, rng.integers(n_in // 3, n_in + 1, n_out), rng.integers(0, 40, n_out))
    deg[rng.random(n_out) < 0.1] = 0
    i = np.concatenate([rng.choice(n_in, d, replace=False) for d in deg])
    j = np.repeat(np.arange(n_out), deg)
    vals = rng.normal(0.0, 0.3, len(i)) if values else np.full(len(i), 0.0625)
    return Layer.from_coo(i, j, vals, n_in, n_out, bias=bias, activation="relu")


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("widths", [[300, 1027, 10], [3000, 203, 2100], [784, 1024, 1024, 10]])
def test_csr4_on_pruned_degree_skew(widths, values):
    """The CSR4 kernels on pruned-like layers: outputs of degree 0 to n_in in one
    warp step, odd widths, staged tiles (n_in 300, 784, 1024) and L1/L2 ones
    (3000, 2100, and every layer with the ``global`` variant), whose gathers are
    issued 1 or 4 chunks at a time (SPDNN_CSR4_GROUP). Ids exact, features
    within 1e-5 of the reference, and the same bits for every form and group:
    the sums run in CSR order whatever the kernel."""
    from spdnn_mpi.backends.cuda.config import KernelConfig

    rng = np.random.default_rng(sum(widths) + values)
    layers = [_pruned_like_layer(rng, n_in, n_out, values,
                                 rng.uniform(-0.3, 0.3, n_out).astype(np.float32))
              for n_in, n_out in zip(widths[:-1], widths[1:])]
    layers[-1].activation = "none"
    net = Network(layers)
    rows = random_inputs(rng, 1000, widths[0], 0.3, binary=False)
    results = []
    for variant, group in (("auto", 4), ("global", 4), ("global", 1)):
        backend = cuda_backend(variant=variant, config=KernelConfig(csr4_group=group))
        backend.load_network(net.layers)
        kinds = set(backend.describe()["kernels"])
        assert kinds <= ({"csr4_smem", "csr4_global"} if variant == "auto" else {"csr4_global"})
        results.append(run_inference(net, rows, backend, want_features=True))
    assert_matches_reference(net, rows, results[0])
    for res in results[1:]:
        np.testing.assert_array_equal(res.alive_ids, results[0].alive_ids)
        np.testing.assert_array_equal(res.features, results[0].features)
