"""Numba kernels of the CPU backend.

Features live in tiles of ``T`` rows stored neuron-major, ``tiles[t, i, r]``,
so that the gather over the inputs of one output neuron reads ``T``
contiguous floats: the inner loop is a plain vector add that the compiler
turns into SIMD, and one tile (``width * T * 4`` bytes) stays in cache while
every output neuron of a layer is computed from it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

#: Rows per tile. A compile-time constant: numba then keeps the accumulators
#: of a tile in vector registers (measured 1.7x faster than a run-time count
#: on the real 1024-neuron layer, 2-core AMD EPYC: 36-40 vs 21 G adds/s).
TILE_ROWS = 64


@njit(parallel=True, cache=True, nogil=True)
def layer_uniform(src, dst, n_tiles, indptr, indices, value, bias, clip, alive):
    """dst = clip(relu(value * (src gathered by W^T) + bias)); alive[slot] = row nonzero.

    All weights equal ``value``: sum the gathered inputs, scale once.
    """
    n_out = len(indptr) - 1
    for t in prange(n_tiles):
        acc = np.zeros(TILE_ROWS, dtype=np.float32)
        peak = np.zeros(TILE_ROWS, dtype=np.float32)
        for j in range(n_out):
            for r in range(TILE_ROWS):
                acc[r] = 0.0
            for p in range(indptr[j], indptr[j + 1]):
                i = indices[p]
                for r in range(TILE_ROWS):
                    acc[r] += src[t, i, r]
            b = bias[j]
            for r in range(TILE_ROWS):
                y = min(max(acc[r] * value + b, np.float32(0.0)), clip)
                dst[t, j, r] = y
                peak[r] = max(peak[r], y)
        for r in range(TILE_ROWS):
            alive[t * TILE_ROWS + r] = peak[r] > 0


@njit(parallel=True, cache=True, nogil=True)
def layer_general(src, dst, n_tiles, indptr, indices, values, bias, clip, alive):
    """Same as ``layer_uniform`` with one value per nonzero."""
    n_out = len(indptr) - 1
    for t in prange(n_tiles):
        acc = np.zeros(TILE_ROWS, dtype=np.float32)
        peak = np.zeros(TILE_ROWS, dtype=np.float32)
        for j in range(n_out):
            for r in range(TILE_ROWS):
                acc[r] = 0.0
            for p in range(indptr[j], indptr[j + 1]):
                i = indices[p]
                v = values[p]
                for r in range(TILE_ROWS):
                    acc[r] += v * src[t, i, r]
            b = bias[j]
            for r in range(TILE_ROWS):
                y = min(max(acc[r] + b, np.float32(0.0)), clip)
                dst[t, j, r] = y
                peak[r] = max(peak[r], y)
        for r in range(TILE_ROWS):
            alive[t * TILE_ROWS + r] = peak[r] > 0


@njit(parallel=True, cache=True, nogil=True)
def compact(src, dst, width, keep):
    """Gather the slots listed in ``keep`` (sorted) into dense tiles of ``dst``."""
    n_new = len(keep)
    n_tiles = (n_new + TILE_ROWS - 1) // TILE_ROWS
    for t in prange(n_tiles):
        for r in range(TILE_ROWS):
            s = t * TILE_ROWS + r
            if s < n_new:
                o = keep[s]
                ot, orow = o // TILE_ROWS, o % TILE_ROWS
                for i in range(width):
                    dst[t, i, r] = src[ot, i, orow]
            else:
                for i in range(width):
                    dst[t, i, r] = 0.0


@njit(parallel=True, cache=True, nogil=True)
def scatter_rows(tiles, n_tiles, rows, indptr, indices, values, binary):
    """Zero the first ``n_tiles`` tiles and write sparse input rows ``rows`` into them.

    Parallel over tiles, so first-touch page faults of a fresh buffer are
    taken by all threads.
    """
    width = tiles.shape[1]
    for t in prange(n_tiles):
        for i in range(width):
            for r in range(TILE_ROWS):
                tiles[t, i, r] = 0.0
        for r in range(TILE_ROWS):
            s = t * TILE_ROWS + r
            if s < len(rows):
                q = rows[s]
                for p in range(indptr[q], indptr[q + 1]):
                    tiles[t, indices[p], r] = 1.0 if binary else values[p]


@njit(parallel=True, cache=True, nogil=True)
def first_touch(tiles):
    """Write zeros to a fresh buffer from all threads, so its page faults are taken
    in parallel now rather than serially inside the first layer."""
    for t in prange(tiles.shape[0]):
        tiles[t] = 0.0


@njit(parallel=True, cache=True, nogil=True)
def gather_rows(tiles, slots, width):
    """Dense row-major copy (len(slots) x width) of the given slots."""
    out = np.empty((len(slots), width), dtype=np.float32)
    for s in prange(len(slots)):
        o = slots[s]
        for i in range(width):
            out[s, i] = tiles[o // TILE_ROWS, i, o % TILE_ROWS]
    return out
