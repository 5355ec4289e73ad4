"""Every layer of a small network in one launch on the CUDA backend (no GPU): the
argument table is the struct the kernel reads, and the loop launches it exactly where
it applies (its numbers: tests/gpu/test_cuda_whole.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_network
from test_cuda_fake_device import backend_and_log  # noqa: F401 (a fixture)
from test_cuda_held import assert_table_is_struct

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda import whole
from spdnn_mpi.model import SparseRows


def test_argument_table_matches_the_kernels_struct_field_for_field():
    assert_table_is_struct(whole.WHOLE_LAYER_DTYPE, "spdnn_whole.cu", "WholeLayer")


def test_the_kernels_launch_bounds_and_rows_are_the_hosts():
    source = (lay.kernel_source_dir() / "spdnn_whole.cu").read_text(encoding="utf-8")
    assert f"__launch_bounds__({whole.THREADS})" in source
    assert whole.KERNEL == "whole_network<8>" and "static_assert(R == 8" in source


def _batch(backend, log, net, n_rows, rng):
    rows = SparseRows.from_dense((rng.random((n_rows, net.layers[0].n_in)) < 0.3)
                                 .astype(np.float32))
    log.clear()
    backend.load_features(rows, drop_empty=False)
    for k in range(len(net.layers)):
        backend.run_layer(k, drop_dead=True)
    res = backend.finish(want_features=True)
    return [x for x in log if x not in ("scatter_rows<u16>", "stamp")], res


def test_a_small_batch_of_csr4_layers_is_one_launch_then_a_graph(backend_and_log):  # noqa: F811
    backend, log = backend_and_log
    rng = np.random.default_rng(2)
    net = random_network(rng, [300, 1027, 10], 0.1)
    backend.load_network(net.layers)
    assert backend._network.whole is not None
    assert backend.describe()["whole_network_rows"] == backend._network.whole.max_rows > 1000
    first, res = _batch(backend, log, net, 1000, rng)
    assert first == ["capture(", "whole_network<8>", "gather_results", "copy", ")", "graph"]
    assert res.layer_seconds is None  # the fake wrote no stamp: none is zero either way
    assert _batch(backend, log, net, 1000, rng)[0] == ["graph"]
    # more rows than one wave of blocks: a layer a launch, another graph
    more, _ = _batch(backend, log, net, backend._network.whole.max_rows + 1, rng)
    assert more[0] == "capture(" and "whole_network<8>" not in more
    assert more[1:3] == ["layer_csr4<true,true>", "layer_csr4<false,true>"]
    # and back: one launch again (captured anew: the larger batch grew the results)
    assert "whole_network<8>" in _batch(backend, log, net, 1000, rng)[0]


def test_grid_rule(backend_and_log):  # noqa: F811
    """One block an item of 8 rows, one wave at most; only a piece that is the whole
    network on a fresh batch (no rows held after a merge)."""
    backend, _log = backend_and_log
    net = random_network(np.random.default_rng(3), [64, 64, 64, 10], 0.2)
    backend.load_network(net.layers)
    one = backend._network.whole
    todo = tuple((k, True) for k in range(3))
    assert one.grid(todo, 0, 1000) == 125
    assert one.grid(todo, 0, 1) == 1
    assert one.max_rows == 8 * one._blocks
    assert one.grid(todo, 0, one.max_rows) == one._blocks
    assert one.grid(todo, 0, one.max_rows - 7) == one._blocks
    assert one.grid(todo, 0, one.max_rows + 1) == 0
    assert one.grid(todo, 8, 1000) == 0  # rows held after a merge
    assert one.grid(todo[:2], 0, 1000) == 0  # the network cut in pieces
    assert one.grid(todo[1:], 0, 1000) == 0


def test_which_networks_run_so(backend_and_log):  # noqa: F811
    """CSR4 layers only (not the ELL, grouped or 32-bit CSR kernels), at most
    ``MAX_EDGES`` weights, and two rows of 8 of the widest layer within a block's
    shared memory."""
    backend, _log = backend_and_log
    rng = np.random.default_rng(4)
    limit = 227 * 1024
    csr4 = [lay.LayerPlan("csr4_smem", "k", 0, 0), lay.LayerPlan("csr4_global", "k", 0, 0)]
    assert whole.qualifies(csr4, 1024, whole.MAX_EDGES, limit)
    assert not whole.qualifies(csr4, 1024, whole.MAX_EDGES + 1, limit)
    assert not whole.qualifies([lay.LayerPlan("csr4_smem", "k", 0, 0),
                                lay.LayerPlan("csr_smem", "k", 0, 0)], 1024, 100, limit)
    assert not whole.qualifies([], 1024, 0, limit)
    assert whole.smem_bytes(1000) == 2 * 8 * 1000 * 4
    assert not whole.qualifies(csr4[1:], 4000, 100, limit)
    general = random_network(rng, [256, 200], 0.05).layers[0]
    general.indices = general.indices.astype(np.int32)  # 32-bit ids: layer_csr
    backend.load_network([general])
    assert backend._network.whole is None
    backend.load_network(random_network(rng, [4000, 30], 0.01).layers)
    assert backend._network.whole is None
    assert backend.describe()["whole_network_rows"] == 0
    heavy = random_network(rng, [400, 400, 10], 0.75)  # 120k + 3k weights
    backend.load_network(heavy.layers)
    assert backend._network.whole is not None
    heavy.layers[1] = random_network(rng, [400, 400], 0.1).layers[0]  # 120k + 16k
    backend.load_network(heavy.layers)
    assert backend._network.whole is None


def _chunks_of_slowest_warp(slots, warps):
    """Chunks of 8 entries the slowest warp waits for: at each of its steps, the
    heaviest output of the 16."""
    deg = (slots.view(np.uint32)[:, 1] & 0xFFFF).astype(np.int64)
    chunks = -(-deg.reshape(-1, warps, whole.STEP) // 8)  # (iteration, warp, output)
    steps = chunks.max(axis=2)
    return int(steps.sum(axis=0).max())


def test_balanced_spans_hold_every_output_once_and_even_out_the_warps():
    rng = np.random.default_rng(5)
    n_out, warps = 1027, whole.THREADS // 32
    deg = rng.integers(0, 40, n_out)
    deg[rng.random(n_out) < 0.05] = rng.integers(300, 700)  # a few heavy outputs
    first = np.concatenate([[0], np.cumsum(-(-deg // 8) * 8)[:-1]])
    spans = np.stack([first, deg], axis=1).astype(np.int32)
    slots = whole.balanced_spans(spans, warps)
    step = warps * whole.STEP
    assert slots.dtype == np.int32 and len(slots) == -(-n_out // step) * step
    words = slots.view(np.uint32)
    ids = words[:, 1] >> 16
    real = ids != whole.EMPTY
    assert sorted(ids[real].tolist()) == list(range(n_out))
    np.testing.assert_array_equal(words[real, 1] & 0xFFFF, deg[ids[real]])
    np.testing.assert_array_equal(words[real, 0], first[ids[real]])
    assert not np.any(words[~real, 1] & 0xFFFF)  # empty slots: no entries
    # the slowest warp: within one step of the bound (the mean or the heaviest step),
    # where output order leaves it several heavy steps
    natural = np.zeros((len(slots), 2), dtype=np.uint32)
    natural[:, 1] = whole.EMPTY << 16
    natural[:n_out, 1] = deg | (np.arange(n_out) << 16)
    chunks = -(-deg // 8)
    bound = max(chunks.max(), -(-np.sort(chunks)[::-1][::whole.STEP].sum() // warps))
    assert _chunks_of_slowest_warp(slots, warps) <= bound + chunks.max()
    assert (_chunks_of_slowest_warp(slots, warps)
            < _chunks_of_slowest_warp(natural.view(np.int32), warps))
    with pytest.raises(ValueError, match="16-bit"):
        whole.balanced_spans(np.array([[0, 70000]], dtype=np.int32), warps)
