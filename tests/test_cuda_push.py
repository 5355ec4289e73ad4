"""The first layer's push form (cuda_push, cuda/spdnn_push.cu).

The host half (when it is exact, when a batch uses it, the layout) runs
everywhere; the GPU tests compare the push form with the pulling kernels bit
for bit and with the reference, and skip with the reason without a device.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_inputs, random_network
from test_cuda import CUDA_OK, CUDA_WHY
from test_cuda_models import _assert_matches_reference

from spdnn_mpi.backends.cuda import push as cuda_push
from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Layer, Network, SparseRows


def _dense_w(layer: Layer) -> np.ndarray:
    """W (n_in x n_out) of a layer, dense."""
    return layer.to_scipy_t().toarray().T


@pytest.mark.parametrize("chunk", [1, 7, 32, 256, 10_000])
@pytest.mark.parametrize("uniform", [False, True])
def test_push_layout_holds_every_weight_once_by_chunk_and_input(chunk, uniform):
    rng = np.random.default_rng(chunk)
    layer = random_network(rng, [53, 91], 0.3, uniform=uniform).layers[0]
    lay = cuda_push.push_layout(layer, chunk)
    c_eff = min(chunk, layer.n_out)
    assert lay.chunk == c_eff and lay.n_chunks == -(-layer.n_out // c_eff)
    assert lay.ptr.size == lay.n_chunks * (layer.n_in + 1) + 1 and lay.ptr[-1] == layer.nnz
    w = _dense_w(layer)
    got = np.zeros_like(w)
    for c in range(lay.n_chunks):
        for k in range(layer.n_in):
            lo, hi = lay.ptr[c * (layer.n_in + 1) + k], lay.ptr[c * (layer.n_in + 1) + k + 1]
            outs = lay.outs[lo:hi].astype(np.int64)
            assert np.all(np.diff(outs) > 0) and np.all(outs < c_eff)
            j = c * c_eff + outs
            assert np.all(j < layer.n_out)
            got[k, j] += lay.weights[lo:hi] if not uniform else layer.uniform_value
    np.testing.assert_array_equal(got, w)
    if uniform:
        assert lay.weights.size == 1


def test_strictly_sorted_rows():
    indptr = np.array([0, 3, 3, 5])
    assert cuda_push.strictly_sorted_rows(indptr, np.array([1, 4, 9, 0, 2]))
    assert not cuda_push.strictly_sorted_rows(indptr, np.array([1, 9, 4, 0, 2]))
    assert not cuda_push.strictly_sorted_rows(indptr, np.array([1, 4, 4, 0, 2]))  # repeat
    # a row may start below the last one's end; offsets need not start at 0
    assert cuda_push.strictly_sorted_rows(np.array([7, 9, 11]), np.array([5, 6, 1, 2]))
    assert cuda_push.strictly_sorted_rows(np.array([0, 0]), np.array([], dtype=np.int64))


def test_push_is_exact_only_with_sorted_rows_and_finite_weights():
    rng = np.random.default_rng(1)
    layer = random_network(rng, [30, 20], 0.3).layers[0]
    assert cuda_push.push_exact(layer)
    bad = layer.values.copy()
    bad[3] = np.inf
    assert not cuda_push.push_exact(Layer(30, 20, layer.indptr, layer.indices, bad))
    idx = layer.indices.copy()
    lo, hi = layer.indptr[0], layer.indptr[1]
    assert hi - lo >= 2
    idx[lo:hi] = idx[lo:hi][::-1]
    assert not cuda_push.push_exact(Layer(30, 20, layer.indptr, idx, layer.values))


def test_a_batch_pushes_by_mode_density_and_order():
    rng = np.random.default_rng(2)
    valued = random_network(rng, [40, 20], 0.3).layers[0]
    uniform = random_network(rng, [40, 20], 0.3, uniform=True).layers[0]
    assert cuda_push.may_push(cuda_push.PUSH_AUTO, valued)
    assert not cuda_push.may_push(cuda_push.PUSH_AUTO, uniform)  # auto: layers with values
    assert cuda_push.may_push(cuda_push.PUSH_ALWAYS, uniform)
    assert not cuda_push.may_push(cuda_push.PUSH_OFF, valued)
    sparse = random_inputs(rng, 50, 40, 0.2, binary=False)
    dense = random_inputs(rng, 50, 40, 0.9, binary=False)
    wants = cuda_push.wants_push
    assert wants(cuda_push.PUSH_AUTO, sparse, 0.5)
    assert not wants(cuda_push.PUSH_AUTO, dense, 0.5)
    assert wants(cuda_push.PUSH_ALWAYS, dense, 0.5)
    assert not wants(cuda_push.PUSH_OFF, sparse, 0.5)
    unsorted = SparseRows(40, sparse.indptr, sparse.indices.copy(), sparse.values)
    r0 = slice(int(unsorted.indptr[0]), int(unsorted.indptr[1]))
    assert r0.stop - r0.start >= 2
    unsorted.indices[r0] = unsorted.indices[r0][::-1]
    assert not wants(cuda_push.PUSH_ALWAYS, unsorted, 0.5)
    empty = SparseRows(40, np.zeros(1, np.int64), np.zeros(0, np.uint16), None)
    assert not wants(cuda_push.PUSH_ALWAYS, empty, 0.5)


def _run(net, rows, push, compress="off", batch=None, variant="auto", dense=False):
    from spdnn_mpi.backends.cuda.backend import CudaBackend

    backend = CudaBackend(variant=variant, defines={
        "SPDNN_PUSH": push, "SPDNN_PUSH_DENSE_MAX_ROWS": 1 << 30 if dense else 0})
    backend.load_network(net.layers)
    res = run_inference(net, rows, backend, want_features=True, compress=compress, batch=batch)
    return res, backend


def _assert_push_equals_pull(net, rows, dense=False, **kw):
    """Pushed (the first layer; with ``dense`` the later ones too) against pulled."""
    pushed, b_push = _run(net, rows, cuda_push.PUSH_ALWAYS, dense=dense, **kw)
    pulled, b_pull = _run(net, rows, cuda_push.PUSH_OFF, **kw)
    assert b_push._push_batch is not None and b_pull._push_batch is None
    assert (b_push.describe()["dense_push_layers"] == net.n_layers - 1) == dense
    np.testing.assert_array_equal(pushed.alive_ids, pulled.alive_ids)
    np.testing.assert_array_equal(pushed.features.view(np.uint32),
                                  pulled.features.view(np.uint32))
    np.testing.assert_array_equal(pushed.live_per_layer, pulled.live_per_layer)
    _assert_matches_reference(net, rows, pushed)


needs_gpu = pytest.mark.skipif(not CUDA_OK, reason=CUDA_WHY)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("in_density", [0.05, 0.3])
@pytest.mark.parametrize("w_density", [0.02, 0.3])
@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("dense", [False, True])
def test_push_equals_pull_on_random_classifiers(seed, in_density, w_density, binary, dense):
    """Random values, odd widths, more outputs than a chunk, empty input rows."""
    rng = np.random.default_rng(300 + seed)
    widths = [int(rng.integers(20, 800)), int(rng.integers(5, 700)), 37, 10]
    net = random_network(rng, widths, w_density, bias="positive", clip=None,
                         activations=["relu", "relu", "none"])
    rows = random_inputs(rng, int(rng.integers(1, 700)), widths[0], in_density, binary=binary)
    _assert_push_equals_pull(net, rows, dense=dense)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("batch", [None, 96])
@pytest.mark.parametrize("dense", [False, True])
def test_push_equals_pull_on_uniform_layers_dropping_rows(batch, dense):
    """The challenge's form: uniform weights, binary inputs, scalar bias, clip,
    rows dying and dropped; in batches the graph is reused with new input rows."""
    rng = np.random.default_rng(8)
    net = random_network(rng, [300] * 7, 0.08, uniform=True, bias="scalar", clip=32.0)
    rows = random_inputs(rng, 500, 300, 0.1)
    _assert_push_equals_pull(net, rows, batch=batch, dense=dense)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dense", [False, True])
def test_push_equals_pull_with_compression(dense):
    """Deep enough for the engine to merge identical rows after the pushed layer."""
    rng = np.random.default_rng(9)
    net = random_network(rng, [128] * 25, 0.1, uniform=True, bias="scalar", clip=32.0)
    distinct = (rng.random((40, 128)) < 0.15).astype(np.float32)
    rows = SparseRows.from_dense(np.repeat(distinct, 16, axis=0))  # rows repeated
    _assert_push_equals_pull(net, rows, compress="auto", dense=dense)


@pytest.mark.gpu
@needs_gpu
def test_push_with_32_bit_input_indices():
    """More than 65536 inputs: the rows' indices are 32-bit."""
    rng = np.random.default_rng(10)
    n_in, n_out = 70_000, 300
    i = rng.integers(0, n_in, 20_000)
    j = rng.integers(0, n_out, 20_000)
    key = np.unique(i.astype(np.int64) * n_out + j)
    i, j = key // n_out, key % n_out
    first = Layer.from_coo(i, j, rng.normal(0.2, 0.5, len(i)), n_in, n_out, bias=-0.1)
    net = Network([first, random_network(rng, [n_out, 10], 0.3, activations="none",
                                         clip=None).layers[0]])
    cols = rng.integers(0, n_in, (200, 400))
    dense = np.zeros((200, n_in), np.float32)
    dense[np.arange(200)[:, None], cols] = rng.uniform(0.1, 1.0, cols.shape)
    rows = SparseRows.from_dense(dense)
    assert rows.indices.dtype.itemsize == 4
    _assert_push_equals_pull(net, rows)


@pytest.mark.gpu
@needs_gpu
def test_push_skips_stored_zero_inputs_exactly():
    """Inputs stored with value 0 (and -0) add nothing, pushed or pulled."""
    rng = np.random.default_rng(11)
    net = random_network(rng, [64, 48, 10], 0.3, bias="positive", clip=None,
                         activations=["relu", "none"])
    base = random_inputs(rng, 100, 64, 0.4, binary=False)
    vals = base.values.copy()
    vals[::3] = 0.0
    vals[1::7] = -0.0
    rows = SparseRows(64, base.indptr, base.indices, vals)
    _assert_push_equals_pull(net, rows)


@pytest.mark.gpu
@needs_gpu
def test_unsorted_inputs_are_pulled_and_auto_pushes_sparse_values():
    rng = np.random.default_rng(12)
    net = random_network(rng, [80, 60, 10], 0.2, bias="positive", clip=None,
                         activations=["relu", "none"])
    rows = random_inputs(rng, 90, 80, 0.2, binary=False)
    res, backend = _run(net, rows, cuda_push.PUSH_AUTO)
    assert backend._push_batch == "u16"
    assert backend.describe()["first_layer_push"]["chunk"] == 60
    _assert_matches_reference(net, rows, res)
    idx = rows.indices.copy()
    for r in range(rows.n_rows):  # every row reversed
        lo, hi = rows.indptr[r], rows.indptr[r + 1]
        idx[lo:hi] = idx[lo:hi][::-1]
    reversed_rows = SparseRows(80, rows.indptr, idx, rows.values[np.concatenate(
        [np.arange(rows.indptr[r], rows.indptr[r + 1])[::-1] for r in range(rows.n_rows)])])
    res, backend = _run(net, reversed_rows, cuda_push.PUSH_ALWAYS)
    assert backend._push_batch is None
    _assert_matches_reference(net, rows, res)
    dense_rows = random_inputs(rng, 90, 80, 0.9, binary=False)
    res, backend = _run(net, dense_rows, cuda_push.PUSH_AUTO)
    assert backend._push_batch is None
    _assert_matches_reference(net, dense_rows, res)
