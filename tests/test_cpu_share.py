"""The CPU backend's shared input lists (``backends.cpu.share``): the same arrays as the
per-layer ``np.unique`` over the rows' bytes that it replaced, on every kind of layer."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_network

from spdnn_mpi.backends.cpu.share import shared_inputs, shared_inputs_all
from spdnn_mpi.model import Layer


def unique_shared_inputs(layer: Layer) -> tuple | None:
    """The former per-layer function, kept here as the reference."""
    d = layer.row_degree
    if layer.values is None and d and layer.n_out >= 2:
        rows = np.ascontiguousarray(np.asarray(layer.indices).reshape(layer.n_out, d))
        keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * d))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        if 2 * len(first) <= layer.n_out:
            inverse = inverse.ravel()
            members = np.argsort(inverse, kind="stable").astype(np.int64)
            member_ptr = np.zeros(len(first) + 1, dtype=np.int64)
            member_ptr[1:] = np.cumsum(np.bincount(inverse, minlength=len(first)))
            rep_ptr = np.arange(0, d * len(first) + 1, d, dtype=np.int64)
            return rep_ptr, np.ascontiguousarray(rows[first].ravel()), members, member_ptr
    return None


def grouped_layer(rng, n_in: int, n_out: int, degree: int, max_group: int, dtype,
                  sort_rows: bool = True) -> Layer:
    """Uniform layer whose outputs read one of a few input lists (groups of 1 to max_group)."""
    lists, owner = [], []
    while len(owner) < n_out:
        chosen = rng.choice(n_in, degree, replace=False)
        lists.append(np.sort(chosen) if sort_rows else chosen)
        owner += [len(lists) - 1] * int(rng.integers(1, max_group + 1))
    owner = rng.permutation(np.array(owner[:n_out]))
    rows = np.stack([lists[g] for g in owner]).astype(dtype)
    indptr = np.arange(0, degree * n_out + 1, degree, dtype=np.int64)
    return Layer(n_in, n_out, indptr, rows.ravel(), None, 0.0625, -0.3, 32.0)


def assert_same(got, want):
    assert (got is None) == (want is None)
    if want is not None:
        assert len(got) == len(want) == 4
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


def layers_of_every_kind(rng) -> list[Layer]:
    from spdnn_mpi.generators.radixnet import radixnet_layer

    layers = [radixnet_layer(1024, k) for k in (1, 2, 7)] + [radixnet_layer(256, 3, seed=4)]
    for degree, max_group, n_in in [(32, 16, 1024), (3, 4, 300), (1, 8, 50), (16, 1, 400),
                                    (5, 2, 70000), (8, 3, 100000), (2, 2, 9), (7, 30, 1000)]:
        dtype = np.uint16 if n_in <= 65536 else np.int32
        layers.append(grouped_layer(rng, n_in, int(rng.integers(2, 900)), degree, max_group,
                                    dtype, sort_rows=degree != 7))
    # values per edge, ragged rows, one output, no edges: never shared
    layers += random_network(rng, [60, 40, 30], 0.2).layers
    layers.append(random_network(rng, [60, 40], 0.2, uniform=True).layers[0])
    layers.append(Layer(5, 1, np.array([0, 3]), np.array([0, 1, 2], np.uint16), None, 1.0))
    layers.append(Layer(5, 4, np.zeros(5, np.int64), np.zeros(0, np.uint16), None, 1.0))
    # lists repeating every 3 rows, then every 5 with a stray row between: the row
    # a stride back is tried first, and a miss must fall back to the hash
    lists = rng.integers(0, 800, (8, 4)).astype(np.uint16)
    picks = [k % 3 for k in range(30)] + [7] + [3 + k % 5 for k in range(40)] + [7, 0, 4]
    layers.append(Layer(800, len(picks), np.arange(0, 4 * len(picks) + 1, 4),
                        lists[picks].ravel(), None, 1.0))
    # rows equal but for their byte order's high byte, and hash-neighbour rows
    rows = np.array([[1, 256], [256, 1], [1, 256], [256, 1], [2, 512], [2, 512]], np.uint16)
    layers.append(Layer(600, 6, np.arange(0, 13, 2), rows.ravel(), None, 1.0))
    return layers


def test_same_arrays_as_np_unique_on_every_kind_of_layer():
    rng = np.random.default_rng(2)
    layers = layers_of_every_kind(rng)
    want = [unique_shared_inputs(layer) for layer in layers]
    assert sum(w is not None for w in want) >= 8 and sum(w is None for w in want) >= 5
    for threads in (1, 2, 3):
        for got, w in zip(shared_inputs_all(layers, threads), want):
            assert_same(got, w)
    for layer, w in zip(layers, want):
        assert_same(shared_inputs(layer), w)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("run_rows", [1 << 22, 700])
def test_runs_of_layers_of_one_kind_in_one_buffer(threads, run_rows, monkeypatch):
    """Layers of one kind back to back in one buffer (a packed store's), some sharing
    too little among them, looked at in runs: each layer's own arrays, at any thread
    count and wherever the runs are cut."""
    from spdnn_mpi.backends.cpu import share

    rng = np.random.default_rng(5)
    made = [grouped_layer(rng, 500, 300, 8, 1 if k % 3 == 1 else 6, np.uint16)
            for k in range(9)]
    base = np.concatenate([layer.indices for layer in made])
    layers = [Layer(lay.n_in, lay.n_out, lay.indptr, base[k * 2400:(k + 1) * 2400], None,
                    lay.uniform_value, lay.bias, lay.clip) for k, lay in enumerate(made)]
    assert all(layer.indices.base is base for layer in layers)
    want = [unique_shared_inputs(layer) for layer in layers]
    assert sum(w is None for w in want) == 3
    monkeypatch.setattr(share, "RUN_ROWS", run_rows)
    for got, w in zip(shared_inputs_all(layers, threads), want):
        assert_same(got, w)


@pytest.mark.parametrize("seed", range(6))
def test_same_arrays_on_random_groupings(seed):
    rng = np.random.default_rng(100 + seed)
    n_out = int(rng.integers(2, 3000))
    degree = int(rng.integers(1, 40))
    n_in = int(rng.integers(degree, 5000))
    # around the "half the outputs distinct" line, where sharing starts
    layer = grouped_layer(rng, n_in, n_out, degree, int(rng.integers(1, 5)), np.uint16)
    assert_same(shared_inputs(layer), unique_shared_inputs(layer))
