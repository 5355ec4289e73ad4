"""The CPU backend's kernels against each other: every special form gives the
bits of the general tile kernel (``layer_tiles``), on random values and
ragged rows, so that compressed runs (few rows) equal uncompressed ones."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_network

from spdnn_mpi.backends.cpu import kernels as k
from spdnn_mpi.backends.cpu.dispatch import layer_entry

T = k.TILE_ROWS


def _layer_args(layer):
    """The arguments the backend passes for ``layer`` (no shared sums), after the rows."""
    return layer_entry(layer, None)[:7]


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("n_rows", [1, 2, 3, k.FEW_ROWS, 9, T])
def test_one_tile_kernels_give_the_tile_kernels_bits(uniform, n_rows):
    rng = np.random.default_rng(n_rows * 2 + uniform)
    layer = random_network(rng, [70, 53], 0.3, uniform=uniform, bias="vector").layers[0]
    args = _layer_args(layer)
    src = np.zeros((1, 70, T), np.float32)
    src[0, :, :n_rows] = np.abs(rng.normal(size=(70, n_rows))).astype(np.float32)
    want = np.zeros_like(src)
    want_alive = np.zeros(T, np.bool_)
    k.layer_tiles(src, want, 1, *args, want_alive)
    kernels = [k.layer_rows] + ([k.layer_few_rows] if n_rows <= k.FEW_ROWS else [])
    for kernel in kernels:
        got = np.full_like(src, np.nan)
        alive = np.ones(T, np.bool_)
        kernel(src, got, n_rows, *args, alive)
        np.testing.assert_array_equal(got[0, :53, :n_rows].view(np.uint32),
                                      want[0, :53, :n_rows].view(np.uint32))
        np.testing.assert_array_equal(alive[:n_rows], want_alive[:n_rows])
        assert not alive[n_rows:].any(), "rows past n_rows must read as dead"


def test_compact_gathers_the_kept_slots_and_zeroes_the_rest():
    rng = np.random.default_rng(5)
    n_tiles, width = 5, 37
    src = rng.normal(size=(n_tiles, width, T)).astype(np.float32)
    keep = np.sort(rng.choice(n_tiles * T, 150, replace=False)).astype(np.int64)
    dst = np.full_like(src, np.nan)
    k.compact(src, dst, width, keep)
    rows = src.transpose(0, 2, 1).reshape(-1, width)
    got = dst.transpose(0, 2, 1).reshape(-1, width)
    np.testing.assert_array_equal(got[: len(keep)], rows[keep])
    assert (got[len(keep): 3 * T] == 0).all()  # the last written tile is padded with zeros


def test_equal_to_head_confirms_exactly():
    rng = np.random.default_rng(6)
    width = 19
    rows = rng.normal(size=(3 * T, width)).astype(np.float32)
    head = np.arange(3 * T, dtype=np.int64)
    twins = rng.choice(np.arange(1, 3 * T), 40, replace=False)
    owners = rng.integers(0, twins.min(), 40)
    rows[twins] = rows[owners]
    head[twins] = owners
    near = twins[:5]
    rows[near, -1] = np.nextafter(rows[near, -1], np.float32(np.inf))  # differ in the last bit
    liars = np.setdiff1d(np.arange(3 * T), np.concatenate([twins, owners]))[:5]
    head[liars] = 0  # a claimed head that is not equal
    tiles = np.ascontiguousarray(rows.reshape(3, T, width).transpose(0, 2, 1))
    same = k.equal_to_head(tiles.view(np.uint32), head, width)
    expected = np.zeros(3 * T, np.bool_)
    expected[twins[5:]] = True
    np.testing.assert_array_equal(same, expected)


def _shared_layer(rng, n_in, n_out, degree, max_group):
    """A uniform layer whose outputs read one of a few input lists (groups of 1 to
    ``max_group`` outputs, scattered over the ids), random value and biases."""
    from spdnn_mpi.model import Layer

    lists, owner = [], []
    while len(owner) < n_out:
        lists.append(np.sort(rng.choice(n_in, degree, replace=False)))
        owner += [len(lists) - 1] * int(rng.integers(1, max_group + 1))
    owner = rng.permutation(np.array(owner[:n_out]))
    rows = np.stack([lists[g] for g in owner]).astype(np.uint16)
    indptr = np.arange(0, degree * n_out + 1, degree, dtype=np.int64)
    bias = rng.uniform(-0.4, -0.01, n_out).astype(np.float32)
    return Layer(n_in, n_out, indptr, rows.ravel(), None, float(rng.uniform(0.05, 0.4)), bias,
                 float(rng.uniform(1.0, 3.0)))


def test_shared_inputs_lists_each_output_once_with_its_own_inputs():
    from spdnn_mpi.backends.cpu.share import shared_inputs
    from spdnn_mpi.generators.radixnet import radixnet_layer

    layer = radixnet_layer(1024, 2)
    rep_ptr, rep_indices, members, member_ptr = shared_inputs(layer)
    assert len(rep_ptr) - 1 == 1024 // 16 and np.all(np.diff(member_ptr) == 16)
    assert np.array_equal(np.sort(members), np.arange(1024))
    own = np.asarray(layer.indices).reshape(1024, 32)
    for g in range(len(rep_ptr) - 1):
        for j in members[member_ptr[g]:member_ptr[g + 1]]:
            assert np.array_equal(own[j], rep_indices[rep_ptr[g]:rep_ptr[g + 1]])
    rng = np.random.default_rng(3)
    values = rng.normal(size=layer.nnz).astype(np.float32)
    from spdnn_mpi.model import Layer

    valued = Layer(layer.n_in, layer.n_out, layer.indptr, layer.indices, values, None, -0.3)
    assert shared_inputs(valued) is None  # per-edge values: every output its own sum
    assert shared_inputs(_shared_layer(rng, 200, 90, 8, 1)) is None  # nothing shared


@pytest.mark.parametrize("n_rows", [1, 3, k.FEW_ROWS, 9, T, 3 * T + 5])
@pytest.mark.parametrize("max_group", [4, 16])
def test_shared_sum_kernels_give_the_tile_kernels_bits(n_rows, max_group):
    """One sum per input list (whole tiles, the rows of one tile, a few rows) equals every
    output summing on its own, bit for bit, on random values."""
    from spdnn_mpi.backends.cpu.share import shared_inputs

    rng = np.random.default_rng(n_rows * 31 + max_group)
    layer = _shared_layer(rng, 300, 211, 16, max_group)
    share = shared_inputs(layer)
    assert share is not None
    args = _layer_args(layer)
    n_tiles = -(-n_rows // T)
    src = np.zeros((n_tiles, 300, T), np.float32)
    dense = (rng.random((n_rows, 300)) < 0.3) * rng.uniform(0.1, 2.0, (n_rows, 300))
    dense[1::3] = 0.0  # dead rows too (every bias is negative)
    for r in range(n_rows):
        src[r // T, :, r % T] = dense[r]
    want = np.zeros((n_tiles, 211, T), np.float32)
    want_alive = np.zeros(n_tiles * T, np.bool_)
    k.layer_tiles(src, want, n_tiles, *args, want_alive)
    if n_tiles > 1:
        kernels = [k.layer_tiles_shared]
    else:
        kernels = [k.layer_rows_shared] + ([k.layer_few_rows_shared] if n_rows <= k.FEW_ROWS
                                           else [])
    flat = lambda a: a.transpose(0, 2, 1).reshape(-1, a.shape[1])[:n_rows]  # noqa: E731
    for kernel in kernels:
        got = np.full_like(want, np.nan)
        alive = np.ones(n_tiles * T, np.bool_)
        kernel(src, got, n_tiles if n_tiles > 1 else n_rows, *share, args[2][0], *args[4:],
               alive)
        np.testing.assert_array_equal(flat(got).view(np.uint32), flat(want).view(np.uint32))
        np.testing.assert_array_equal(alive[:n_rows], want_alive[:n_rows])
        assert alive[:n_rows].any() and (n_rows == 1 or not alive[:n_rows].all())
        assert not alive[n_rows:T].any() or n_tiles > 1, "rows past n_rows must read as dead"


@pytest.mark.parametrize("compress", ["off", "auto"])
@pytest.mark.parametrize("distinct", [700, 3])
def test_backend_with_shared_sums_gives_the_same_bits(compress, distinct, monkeypatch):
    """The backend with shared sums against every output summing on its own (no
    shared input lists found), over rows that die and compact, and (3 distinct rows,
    auto) merge down to a few rows of one tile: the same survivors and final
    features, bit for bit; the ids are the reference's."""
    from spdnn_mpi.backends.cpu import backend as cpu_backend
    from spdnn_mpi.backends.cpu import share as cpu_share
    from spdnn_mpi.check_policy import CheckCosts
    from spdnn_mpi.engine import run_inference
    from spdnn_mpi.model import Network, SparseRows
    from spdnn_mpi.reference import reference_infer

    rng = np.random.default_rng(11)
    widths = [400, 256, 300, 256, 256]
    net = Network([_shared_layer(rng, a, b, 16, 16) for a, b in zip(widths[:-1], widths[1:])])
    density = rng.uniform(0.0005, 0.05, (700, 1))  # sparse rows die, dense ones live
    dense = ((rng.random((700, 400)) < density) * rng.uniform(0.2, 2.0, (700, 400)))
    dense = dense.astype(np.float32)
    if distinct < 700:
        dense = dense[np.argsort(-density.ravel())[:distinct]].repeat(-(-700 // distinct), 0)
    rows = SparseRows.from_dense(dense[:700])
    results = []
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr(cpu_share, "shared_inputs_all",
                                lambda layers, threads=None: [None] * len(layers))
        backend = cpu_backend.CpuBackend()
        backend.check_costs = CheckCosts()  # free: every checkpoint merges (the kernels' test)
        backend.load_network(net.layers)
        assert backend.describe()["shared_sum_layers"] == (len(net.layers) if shared else 0)
        results.append(run_inference(net, rows, backend, want_features=True, compress=compress))
    ids, _ = reference_infer(net, rows)
    assert np.array_equal(results[0].alive_ids, ids) and len(ids) > 0
    assert np.array_equal(results[0].alive_ids, results[1].alive_ids)
    assert np.array_equal(results[0].features.view(np.uint32), results[1].features.view(np.uint32))
    live = results[0].live_per_layer
    if distinct == 700:
        assert live[-1] * 10 <= 9 * 700  # a tenth died: the live rows were compacted
    elif compress == "auto":
        assert results[0].computed_rows_per_layer[-1] <= k.FEW_ROWS  # few rows of one tile
