"""Numba kernels of the CPU backend.

Features live in tiles of ``T`` rows stored neuron-major, ``tiles[t, i, r]``,
so that the gather over the inputs of one output neuron reads ``T``
contiguous floats: the inner loop is a plain vector add that the compiler
turns into SIMD, and one tile (``width * T * 4`` bytes) stays in cache while
every output neuron of a layer is computed from it.
"""

from __future__ import annotations

import os

import numpy as np

from spdnn_mpi.util import jitcache

numba = jitcache.load_numba(__file__)  # before the @njit(cache=True) below
njit = numba.njit
prange = numba.prange

#: Threads waiting at the end of a parallel loop sleep rather than spin (read by
#: libgomp when numba starts its threads, at the first parallel kernel; a user's
#: OMP_WAIT_POLICY wins). On a machine shared with other work, spinning threads
#: take the core a descheduled partner needs, and a layer of a few milliseconds
#: waits a scheduler slice for it (see docs/design.md, "CPU threads").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

#: Rows per tile. A compile-time constant: numba then keeps the accumulators
#: of a tile in vector registers (measured 1.7x faster than a run-time count
#: on the real 1024-neuron layer, 2-core AMD EPYC: 36-40 vs 21 G adds/s).
TILE_ROWS = 64


@njit(cache=True, nogil=True, inline="always")
def _store_outputs(acc, b, floor, clip, dst, t, j, peak, n):
    """Output ``j`` of the first ``n`` rows of tile ``t``: min(max(acc + b, floor),
    clip), and each row's largest magnitude so far (which says whether it lives).
    Inlined, so a compile-time ``n`` (TILE_ROWS) keeps the vector loop."""
    for r in range(n):
        y = min(max(acc[r] + b, floor), clip)
        dst[t, j, r] = y
        peak[r] = max(peak[r], abs(y))


@njit(cache=True, nogil=True, inline="always")
def _tile_layer(src, dst, t, indptr, indices, values, uniform, bias, floor, clip, alive, acc,
                peak):
    """One tile of a layer: dst = min(max(W^T-gather of src + bias, floor), clip).

    ``floor`` is 0 for ReLU, -inf for no activation; alive[slot]: any output of
    the row is nonzero (its largest magnitude is > 0).

    ``uniform``: every weight equals ``values[0]``: sum the gathered inputs,
    scale once (what the challenge's 1/16 weights need to match the reference
    bit for bit); else one value per nonzero.
    """
    n_out = len(indptr) - 1
    for r in range(TILE_ROWS):
        peak[r] = 0.0
    for j in range(n_out):
        for r in range(TILE_ROWS):
            acc[r] = 0.0
        if uniform:
            for p in range(indptr[j], indptr[j + 1]):
                i = indices[p]
                for r in range(TILE_ROWS):
                    acc[r] += src[t, i, r]
            for r in range(TILE_ROWS):
                acc[r] *= values[0]
        else:
            for p in range(indptr[j], indptr[j + 1]):
                i = indices[p]
                v = values[p]
                for r in range(TILE_ROWS):
                    acc[r] += v * src[t, i, r]
        _store_outputs(acc, bias[j], floor, clip, dst, t, j, peak, TILE_ROWS)
    for r in range(TILE_ROWS):
        alive[t * TILE_ROWS + r] = peak[r] > 0


@njit(parallel=True, cache=True, nogil=True)
def layer_tiles(src, dst, n_tiles, indptr, indices, values, uniform, bias, floor, clip, alive):
    """A layer over ``n_tiles`` tiles, one tile per thread at a time."""
    for t in prange(n_tiles):
        acc = np.zeros(TILE_ROWS, dtype=np.float32)
        peak = np.zeros(TILE_ROWS, dtype=np.float32)
        _tile_layer(src, dst, t, indptr, indices, values, uniform, bias, floor, clip, alive, acc,
                    peak)


@njit(cache=True, nogil=True)
def layer_rows(src, dst, n_rows, indptr, indices, values, uniform, bias, floor, clip, alive):
    """The first ``n_rows`` rows of tile 0 (one tile held: compressed, converged rows)
    on the calling thread, computing only those rows; rows past ``n_rows`` read
    as dead. Same sums in the same order as ``_tile_layer``, whose loops keep
    the compile-time TILE_ROWS trip count that a full tile needs (a run-time
    count there is 1.5-1.7x slower). Measured on 2 cores, one 1024-wide tile:
    0.16 ms for 10 rows, 0.31 ms for 64, against 0.29 ms for the whole tile
    serially and 2.0 ms through prange (no thread pool to wake here).
    """
    n_out = len(indptr) - 1
    acc = np.zeros(TILE_ROWS, dtype=np.float32)
    peak = np.zeros(TILE_ROWS, dtype=np.float32)
    for j in range(n_out):
        acc[:n_rows] = 0.0
        if uniform:
            for p in range(indptr[j], indptr[j + 1]):
                i = indices[p]
                for r in range(n_rows):
                    acc[r] += src[0, i, r]
            for r in range(n_rows):
                acc[r] *= values[0]
        else:
            for p in range(indptr[j], indptr[j + 1]):
                i = indices[p]
                v = values[p]
                for r in range(n_rows):
                    acc[r] += v * src[0, i, r]
        _store_outputs(acc, bias[j], floor, clip, dst, 0, j, peak, n_rows)
    for r in range(TILE_ROWS):
        alive[r] = r < n_rows and peak[r] > 0


#: Up to this many rows held, ``layer_few_rows`` computes them one row at a
#: time (converged, compressed rows: one representative in the challenge's
#: deep layers).
FEW_ROWS = 4


@njit(cache=True, nogil=True, inline="always")
def _copy_row(src, r, x):
    """Row ``r`` of the one tile held, copied out contiguous: the few-row kernels'
    gathers then read one row that stays in L1."""
    for i in range(src.shape[1]):
        x[i] = src[0, i, r]


@njit(cache=True, nogil=True)
def layer_few_rows(src, dst, n_rows, indptr, indices, values, uniform, bias, floor, clip,
                   alive):
    """``layer_rows`` for a handful of rows, one row after the other.

    Same sums in the same order (bit for bit ``_tile_layer``'s), but each row
    is first copied out of its tile, so the gather reads one contiguous row
    that stays in L1 instead of one cache line per input, and the inner loop
    is the gather itself rather than a one-trip loop over rows.
    """
    n_out = len(indptr) - 1
    x = np.empty(src.shape[1], dtype=np.float32)
    acc = np.zeros(1, dtype=np.float32)
    alive[:TILE_ROWS] = False
    for r in range(n_rows):
        _copy_row(src, r, x)
        peak = np.float32(0.0)
        for j in range(n_out):
            acc[0] = 0.0
            if uniform:
                for p in range(indptr[j], indptr[j + 1]):
                    acc[0] += x[indices[p]]
                acc[0] *= values[0]
            else:
                for p in range(indptr[j], indptr[j + 1]):
                    acc[0] += values[p] * x[indices[p]]
            y = min(max(acc[0] + bias[j], floor), clip)
            dst[0, j, r] = y
            peak = max(peak, abs(y))
        alive[r] = peak > 0


# -- uniform layers whose outputs share their inputs -------------------------
# ``share`` = (rep_ptr, rep_indices, members, member_ptr): the distinct input
# lists of the layer (rep g reads rep_indices[rep_ptr[g]:rep_ptr[g + 1]], in
# CSR order) and the outputs that read each (members[member_ptr[g]:
# member_ptr[g + 1]]). With one weight value those outputs' sums are the same
# adds in the same order, so each is done once and every member applies its
# own bias, floor and clip: the bits of the kernels above, with 1/16 of the
# adds on RadiX-Net layers (groups of 16 outputs).


@njit(cache=True, nogil=True, inline="always")
def _tile_layer_shared(src, dst, t, rep_ptr, rep_indices, members, member_ptr, scale, bias,
                       floor, clip, alive, acc, peak):
    """``_tile_layer`` of a uniform layer, one sum per distinct input list."""
    for r in range(TILE_ROWS):
        peak[r] = 0.0
    for g in range(len(rep_ptr) - 1):
        for r in range(TILE_ROWS):
            acc[r] = 0.0
        for p in range(rep_ptr[g], rep_ptr[g + 1]):
            i = rep_indices[p]
            for r in range(TILE_ROWS):
                acc[r] += src[t, i, r]
        for r in range(TILE_ROWS):
            acc[r] *= scale
        for m in range(member_ptr[g], member_ptr[g + 1]):
            j = members[m]
            _store_outputs(acc, bias[j], floor, clip, dst, t, j, peak, TILE_ROWS)
    for r in range(TILE_ROWS):
        alive[t * TILE_ROWS + r] = peak[r] > 0


@njit(parallel=True, cache=True, nogil=True)
def layer_tiles_shared(src, dst, n_tiles, rep_ptr, rep_indices, members, member_ptr, scale,
                       bias, floor, clip, alive):
    """``layer_tiles`` of a uniform layer whose outputs share input lists."""
    for t in prange(n_tiles):
        acc = np.zeros(TILE_ROWS, dtype=np.float32)
        peak = np.zeros(TILE_ROWS, dtype=np.float32)
        _tile_layer_shared(src, dst, t, rep_ptr, rep_indices, members, member_ptr, scale, bias,
                           floor, clip, alive, acc, peak)


@njit(cache=True, nogil=True)
def layer_rows_shared(src, dst, n_rows, rep_ptr, rep_indices, members, member_ptr, scale, bias,
                      floor, clip, alive):
    """``layer_rows`` of a uniform layer whose outputs share input lists."""
    acc = np.zeros(TILE_ROWS, dtype=np.float32)
    peak = np.zeros(TILE_ROWS, dtype=np.float32)
    for g in range(len(rep_ptr) - 1):
        acc[:n_rows] = 0.0
        for p in range(rep_ptr[g], rep_ptr[g + 1]):
            i = rep_indices[p]
            for r in range(n_rows):
                acc[r] += src[0, i, r]
        for r in range(n_rows):
            acc[r] *= scale
        for m in range(member_ptr[g], member_ptr[g + 1]):
            j = members[m]
            _store_outputs(acc, bias[j], floor, clip, dst, 0, j, peak, n_rows)
    for r in range(TILE_ROWS):
        alive[r] = r < n_rows and peak[r] > 0


@njit(cache=True, nogil=True)
def layer_few_rows_shared(src, dst, n_rows, rep_ptr, rep_indices, members, member_ptr, scale,
                          bias, floor, clip, alive):
    """``layer_few_rows`` of a uniform layer whose outputs share input lists."""
    x = np.empty(src.shape[1], dtype=np.float32)
    acc = np.zeros(1, dtype=np.float32)
    alive[:TILE_ROWS] = False
    for r in range(n_rows):
        _copy_row(src, r, x)
        peak = np.float32(0.0)
        for g in range(len(rep_ptr) - 1):
            acc[0] = 0.0
            for p in range(rep_ptr[g], rep_ptr[g + 1]):
                acc[0] += x[rep_indices[p]]
            acc[0] *= scale
            for m in range(member_ptr[g], member_ptr[g + 1]):
                j = members[m]
                y = min(max(acc[0] + bias[j], floor), clip)
                dst[0, j, r] = y
                peak = max(peak, abs(y))
        alive[r] = peak > 0


@njit(parallel=True, cache=True, nogil=True)
def compact(src, dst, width, keep):
    """Gather the slots listed in ``keep`` (sorted) into dense tiles of ``dst``.

    Neuron by neuron within each destination tile, so the writes run along
    a tile and the reads come from the few source tiles that sorted slots
    span (row by row instead, every access was a new cache line: 2.4x slower
    on the 1024 network's compactions).
    """
    n_new = len(keep)
    n_tiles = (n_new + TILE_ROWS - 1) // TILE_ROWS
    for t in prange(n_tiles):
        src_tile = np.empty(TILE_ROWS, dtype=np.int64)
        src_row = np.empty(TILE_ROWS, dtype=np.int64)
        m = min(TILE_ROWS, n_new - t * TILE_ROWS)
        for r in range(m):
            o = keep[t * TILE_ROWS + r]
            src_tile[r], src_row[r] = o // TILE_ROWS, o % TILE_ROWS
        for i in range(width):
            for r in range(m):
                dst[t, i, r] = src[src_tile[r], i, src_row[r]]
            for r in range(m, TILE_ROWS):
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


#: 64-bit FNV-1a over the 32-bit words of a row (finding candidate groups only:
#: every merge is confirmed by an exact comparison).
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(parallel=True, cache=True, nogil=True)
def row_hashes(bits, n_rows, width):
    """Hash of each of the first ``n_rows`` slots over neurons ``[0, width)``.

    ``bits`` is the tile buffer viewed as uint32, so equal hashes come from
    equal bit patterns (0.0 and -0.0 differ, as they must for bit identity).
    """
    out = np.empty(n_rows, dtype=np.uint64)
    n_tiles = (n_rows + TILE_ROWS - 1) // TILE_ROWS
    for t in prange(n_tiles):
        h = np.full(TILE_ROWS, _FNV_OFFSET, dtype=np.uint64)
        for i in range(width):
            for r in range(TILE_ROWS):
                h[r] = (h[r] ^ np.uint64(bits[t, i, r])) * _FNV_PRIME
        for r in range(TILE_ROWS):
            s = t * TILE_ROWS + r
            if s < n_rows:
                out[s] = h[r]
    return out


@njit(parallel=True, cache=True, nogil=True)
def equal_to_head(bits, head, width):
    """``out[s]``: slot s is bit-identical to slot ``head[s]`` over ``[0, width)``.

    Per tile, only the slots with another head are compared, neuron by
    neuron, and each drops out at its first difference; a tile of rows
    that are their own heads costs nothing (before, every slot of every
    tile was visited at every neuron: most of a check's time at layer 1).
    """
    n_rows = len(head)
    out = np.zeros(n_rows, dtype=np.bool_)
    n_tiles = (n_rows + TILE_ROWS - 1) // TILE_ROWS
    for t in prange(n_tiles):
        cand = np.empty(TILE_ROWS, dtype=np.int64)
        n_cand = 0
        for r in range(TILE_ROWS):
            s = t * TILE_ROWS + r
            if s < n_rows and head[s] != s:
                cand[n_cand] = r
                n_cand += 1
        i = 0
        while n_cand > 0 and i < width:
            still = 0
            for c in range(n_cand):
                r = cand[c]
                h = head[t * TILE_ROWS + r]
                if bits[t, i, r] == bits[h // TILE_ROWS, i, h % TILE_ROWS]:
                    cand[still] = r
                    still += 1
            n_cand = still
            i += 1
        for c in range(n_cand):
            out[t * TILE_ROWS + cand[c]] = True
    return out
