"""The CUDA backend as a whole (GPU): real and generated challenge networks,
batching, graphs on and off, memory, the layout build's progress, the GPU peers."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import challenge_dir, random_inputs, random_network

from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Layer, Network, SparseRows
from spdnn_mpi.reference import reference_infer

from .gpu_helpers import check, cuda_backend


def _read_real_layers(n_layers: int) -> list[Layer]:
    """Layers 1..n of the official 1024 network (gz TSV files)."""
    folder = challenge_dir() / "neuron1024"
    if not folder.is_dir():
        pytest.skip(f"official 1024 network not found in {folder} (set SPDNN_CHALLENGE_DIR)")
    from spdnn_mpi.formats.tsv.tree import iter_layers

    return list(iter_layers(folder, 1024, n_layers, bias=-0.30, clip=32.0))


@pytest.mark.parametrize("variant", ["auto", "global", "csr"])
def test_real_1024_network_categories(variant):
    rng = np.random.default_rng(5)
    net = Network(_read_real_layers(30))
    # ~10% dense binary rows, plus denser ones so that some rows survive
    rows = random_inputs(rng, 3000, 1024, 0.1)
    dense = random_inputs(rng, 1000, 1024, 0.4)
    both = SparseRows(1024, np.concatenate([rows.indptr, dense.indptr[1:] + rows.indptr[-1]]),
                      np.concatenate([rows.indices, dense.indices]))
    res = check(net, both, cuda_backend(variant=variant), features=False)
    assert res.live_per_layer[0] > 0 and len(res.alive_ids) < both.n_rows


@pytest.mark.parametrize("variant", ["auto", "csr"])
def test_radixnet_4096_categories_and_batching(variant):
    from spdnn_mpi.generators.radixnet import radixnet_network

    rng = np.random.default_rng(6)
    net = radixnet_network(4096, 16)
    a = random_inputs(rng, 1500, 4096, 0.1)
    b = random_inputs(rng, 500, 4096, 0.45)
    rows = SparseRows(4096, np.concatenate([a.indptr, b.indptr[1:] + a.indptr[-1]]),
                      np.concatenate([a.indices, b.indices]))
    backend = cuda_backend(variant=variant)
    whole = check(net, rows, backend, features=True)
    batched = run_inference(net, rows, backend, batch=300, want_features=True)
    assert batched.batches == 7
    assert np.array_equal(batched.alive_ids, whole.alive_ids)
    assert np.array_equal(batched.features, whole.features)
    assert np.array_equal(batched.live_per_layer, whole.live_per_layer)
    direct = cuda_backend(variant=variant, graphs=False)  # launches without CUDA graphs
    direct.load_network(net.layers)
    again = run_inference(net, rows, direct, batch=700, want_features=True)
    assert np.array_equal(again.alive_ids, whole.alive_ids)
    assert np.array_equal(again.features, whole.features)
    assert backend.describe()["graphs"] == "on"


@pytest.mark.parametrize("mixed", [False, True])
def test_radixnet_16384_padded_compactions_match_reference(mixed):
    """Rows 16384 wide that die fast: compactions on write put each tile's survivors at
    an 8-aligned slot with dead padding rows after them (spdnn_layer.cuh), then an
    exact compaction drops the padding; features and categories stay the reference's.
    ``mixed``: layers 4 and 6 have per-weight values, so a kernel without a padded walk
    follows a padded plan and compacts it exactly."""
    import dataclasses

    from spdnn_mpi.generators.radixnet import radixnet_network

    rng = np.random.default_rng(8)
    net = radixnet_network(16384, 10)
    if mixed:
        for k in (4, 6):
            layer = net.layers[k]
            scale = rng.uniform(0.8, 1.2, layer.indices.size)
            values = (layer.uniform_value * scale).astype(np.float32)
            net.layers[k] = dataclasses.replace(layer, values=values, uniform_value=None)
    a = random_inputs(rng, 1200, 16384, 0.1)
    b = random_inputs(rng, 400, 16384, 0.45)
    rows = SparseRows(16384, np.concatenate([a.indptr, b.indptr[1:] + a.indptr[-1]]),
                      np.concatenate([a.indices, b.indices]))
    for graphs in (True, False):
        backend = cuda_backend(graphs=graphs)
        res = check(net, rows, backend, features=True)
        assert 0 < len(res.alive_ids) < rows.n_rows
        info = backend.describe()
        assert 0 < info["padded_compactions_last_batch"] <= info["compactions_last_batch"]


def test_describe_reports_memory_and_timing():
    rng = np.random.default_rng(8)
    net = random_network(rng, [100, 100, 100])
    backend = cuda_backend(device=0)
    backend.load_network(net.layers)
    one_launch = backend.describe()["whole_network_rows"]  # up to so many: no layer times
    assert one_launch > 64
    assert run_inference(net, random_inputs(rng, 64, 100, 0.3), backend).layer_seconds is None
    res = run_inference(net, random_inputs(rng, one_launch + 1, 100, 0.3), backend)
    info = backend.describe()
    assert info["peak_device_bytes"] > 0 and info["sms"] > 0
    assert res.layer_seconds is not None and len(res.layer_seconds) == 2
    assert backend.max_batch_rows(1024) >= 32


def test_released_buffers_are_allocated_again_and_graphs_still_serve():
    """release_buffers (before a peer) frees the device arrays of the batch; the
    next run allocates them again and its results are the same bit for bit."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(9)
    net = random_network(rng, [300, 300, 300, 300])
    rows = random_inputs(rng, 2000, 300, 0.2)
    backend = cuda_backend(device=0)
    backend.load_network(net.layers)
    first = run_inference(net, rows, backend, want_features=True)
    held = cp.get_default_memory_pool().used_bytes()
    backend.release_buffers()
    assert cp.get_default_memory_pool().used_bytes() < held
    again = run_inference(net, rows, backend, want_features=True)
    np.testing.assert_array_equal(first.alive_ids, again.alive_ids)
    np.testing.assert_array_equal(first.features.view(np.uint32), again.features.view(np.uint32))


@pytest.mark.parametrize("peer", ["cusparse", "torch"])
def test_gpu_peers_agree_with_reference(peer):
    from spdnn_mpi.bench.peers import gpu_sparse as peers_gpu
    from spdnn_mpi.errors import SpdnnError

    rng = np.random.default_rng(9)
    net = random_network(rng, [80, 80, 80, 80], bias="vector")
    rows = random_inputs(rng, 120, 80, 0.2)
    fn = peers_gpu.cusparse_infer if peer == "cusparse" else peers_gpu.torch_sparse_infer
    try:
        ids, seconds = fn(net, rows)
    except SpdnnError as exc:
        pytest.skip(str(exc))
    ref_ids, _ = reference_infer(net, rows)
    assert np.array_equal(ids, ref_ids) and seconds > 0


def test_layout_build_reports_progress_per_layer():
    """The CUDA layout build (seconds at N = 65536 x 1920) tells a Progress how far it is."""
    from spdnn_mpi.util.progress import Progress

    rng = np.random.default_rng(12)
    network = random_network(rng, [96] * 7)
    lines, done = [], []
    bar = Progress("layout", network.n_layers, lines.append, every=0.0)
    backend = cuda_backend()
    backend.load_network(network.layers, progress=lambda k: (done.append(k), bar(k)))
    assert done == list(range(1, network.n_layers + 1))
    assert lines[-1].startswith(f"layout: layer {network.n_layers}/{network.n_layers}")
    rows = random_inputs(rng, 50, 96, 0.2)
    res = run_inference(network, rows, backend)
    np.testing.assert_array_equal(res.alive_ids, reference_infer(network, rows)[0])
