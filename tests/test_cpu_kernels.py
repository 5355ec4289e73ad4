"""The CPU backend's kernels against each other: every special form gives the
bits of the general tile kernel (``layer_tiles``), on random values and
ragged rows, so that compressed runs (few rows) equal uncompressed ones."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_network

from spdnn_mpi.backends import cpu_kernels as k

T = k.TILE_ROWS


def _layer_args(layer):
    uniform = layer.values is None
    values = (np.array([layer.uniform_value], np.float32) if uniform
              else np.asarray(layer.values, np.float32))
    return (np.ascontiguousarray(layer.indptr, dtype=np.int64), np.ascontiguousarray(layer.indices),
            values, uniform, layer.bias_vector().astype(np.float32), np.float32(layer.floor),
            np.float32(np.inf if layer.clip is None else layer.clip))


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
