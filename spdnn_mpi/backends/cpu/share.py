"""Which outputs of a layer read the same input list: the CPU backend's shared sums.

In a uniform fixed-degree layer (every RadiX-Net layer of the challenge)
many outputs read exactly the same inputs, so the backend sums each distinct
input list once (see ``cpu_kernels``). Finding them was ``np.unique`` over
the rows' bytes per layer, 0.2 ms a layer: a third of a second at 1920
layers, longer than the inference it prepares. One numba kernel now hashes
the rows of a layer, confirms equal rows exactly, and orders the distinct
lists as that ``np.unique`` did (by their bytes, as ``memcmp`` compares
them), so the result arrays are the same; layers are spread over the
threads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from spdnn_mpi.model import Layer
from spdnn_mpi.util import jitcache

jitcache.configure(__file__)  # before the @njit(cache=True) below: see jitcache

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SALT = np.uint64(0x2545F4914F6CDD1D)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


@njit(cache=True, nogil=True)
def _bytes_less(row_bytes, a, b):
    """Row ``a`` before row ``b`` when their bytes compare lower (memcmp order)."""
    for c in range(row_bytes.shape[1]):
        x, y = row_bytes[a, c], row_bytes[b, c]
        if x != y:
            return x < y
    return False


@njit(cache=True, nogil=True)
def _sort_rows(ids, row_bytes):
    """``ids`` (rows that all differ) sorted by their bytes: a bottom-up merge sort."""
    n = len(ids)
    src = ids.copy()
    dst = np.empty_like(ids)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j, o = lo, mid, lo
            while i < mid and j < hi:
                if _bytes_less(row_bytes, src[j], src[i]):
                    dst[o] = src[j]
                    j += 1
                else:
                    dst[o] = src[i]
                    i += 1
                o += 1
            while i < mid:
                dst[o] = src[i]
                i += 1
                o += 1
            while j < hi:
                dst[o] = src[j]
                j += 1
                o += 1
        src, dst = dst, src
        width *= 2
    return src


@njit(cache=True, nogil=True)
def _group_rows(words):
    """(number of distinct rows, group of each row, first row of each group), groups in
    order of first appearance; -1 as soon as more than half the rows are distinct.
    ``words``: each row's bytes as unsigned words (8 bytes when the row length allows,
    so a 32-input uint16 row is 8 words to hash and to compare)."""
    n, w = words.shape
    size = 1
    while size < 2 * n:
        size *= 2
    # a weighted sum per row (independent products, vectorised) then mixed; rows of
    # equal hashes are compared word by word, so a collision costs time, never results
    weight = np.empty(w, dtype=np.uint64)
    for c in range(w):
        weight[c] = np.uint64(2 * c + 1) * _GOLDEN
    hashes = np.empty(n, dtype=np.uint64)
    for r in range(n):
        h = np.uint64(0)
        for c in range(w):
            h += (np.uint64(words[r, c]) ^ _SALT) * weight[c]
        h ^= h >> np.uint64(29)
        h *= _MIX
        h ^= h >> np.uint64(32)
        hashes[r] = h
    table = np.full(size, -1, dtype=np.int64)
    heads = np.empty(n, dtype=np.int64)
    group_of = np.empty(n, dtype=np.int64)
    n_groups = 0
    for r in range(n):
        h = hashes[r]
        slot = np.int64(h & np.uint64(size - 1))
        while True:
            g = table[slot]
            if g < 0:
                table[slot] = n_groups
                heads[n_groups] = r
                group_of[r] = n_groups
                n_groups += 1
                break
            head = heads[g]
            if hashes[head] == h:
                same = True
                for c in range(w):
                    if words[head, c] != words[r, c]:
                        same = False
                        break
                if same:
                    group_of[r] = g
                    break
            slot = (slot + 1) & (size - 1)
        if 2 * n_groups > n:
            return -1, group_of, heads
    return n_groups, group_of, heads[:n_groups]


@njit(cache=True, nogil=True)
def _share_layer(rows, words, row_bytes):
    """(distinct lists in byte order, members by list, member_ptr), or an empty
    ``member_ptr`` when the layer shares too little (see :func:`shared_inputs_all`);
    ``words`` and ``row_bytes``: the rows' bytes as words and as bytes."""
    n, d = rows.shape
    n_groups, group_of, heads = _group_rows(words)
    if n_groups < 0:
        return np.empty((0, d), rows.dtype), np.empty(0, np.int64), np.empty(0, np.int64)
    order = _sort_rows(heads, row_bytes)  # head rows in byte order
    rank = np.empty(n_groups, dtype=np.int64)
    for i in range(n_groups):
        rank[group_of[order[i]]] = i
    member_ptr = np.zeros(n_groups + 1, dtype=np.int64)
    for r in range(n):
        member_ptr[rank[group_of[r]] + 1] += 1
    for g in range(n_groups):
        member_ptr[g + 1] += member_ptr[g]
    fill = member_ptr[:-1].copy()
    members = np.empty(n, dtype=np.int64)
    for r in range(n):  # ascending rows: each list's members in order
        g = rank[group_of[r]]
        members[fill[g]] = r
        fill[g] += 1
    reps = np.empty((n_groups, d), dtype=rows.dtype)
    for i in range(n_groups):
        reps[i] = rows[order[i]]
    return reps, members, member_ptr


def _word_bytes(row_bytes: int) -> int:
    """The widest unsigned word (up to 8 bytes) that divides a row of ``row_bytes``."""
    return next(size for size in (8, 4, 2, 1) if row_bytes % size == 0)


def _words(rows: np.ndarray) -> np.ndarray:
    """Each row's bytes as the widest unsigned words that divide them."""
    n_bytes = rows.shape[1] * rows.itemsize
    size = _word_bytes(n_bytes)
    return rows.view(np.dtype(f"u{size}")).reshape(len(rows), n_bytes // size)


def _shared_degree(layer: Layer) -> int:
    """The layer's degree where it may share sums (uniform values, the same degree for
    every output, two outputs or more), else 0."""
    if layer.values is None and layer.n_out >= 2:
        return layer.row_degree or 0
    return 0


def share_word_bytes(layer: Layer) -> int:
    """0 where ``layer`` cannot share sums, else the word its rows are hashed in: with
    the indices' dtype, what decides the signature of the kernels that look."""
    d = _shared_degree(layer)
    return _word_bytes(d * np.asarray(layer.indices).itemsize) if d else 0


def _rows(layer: Layer) -> np.ndarray | None:
    """The layer's input lists as an (n_out, degree) array when it may share sums."""
    d = _shared_degree(layer)
    return np.ascontiguousarray(np.asarray(layer.indices).reshape(layer.n_out, d)) if d else None


def _share(layer: Layer) -> tuple | None:
    rows = _rows(layer)
    if rows is None:
        return None
    reps, members, member_ptr = _share_layer(rows, _words(rows),
                                             rows.view(np.uint8).reshape(len(rows), -1))
    if not len(member_ptr):
        return None
    d = rows.shape[1]
    return np.arange(0, d * len(reps) + 1, d, dtype=np.int64), reps.ravel(), members, member_ptr


def shared_inputs_all(layers: Sequence[Layer], threads: int | None = None) -> list[tuple | None]:
    """:func:`shared_inputs` of every layer, the layers spread over ``threads`` threads
    (default: numba's): the kernel runs without the GIL."""
    import numba

    threads = numba.get_num_threads() if threads is None else threads
    layers = list(layers)
    if threads <= 1 or len(layers) < 2 * threads:
        return [_share(layer) for layer in layers]
    from concurrent.futures import ThreadPoolExecutor

    step = -(-len(layers) // threads)
    chunks = [layers[i:i + step] for i in range(0, len(layers), step)]
    with ThreadPoolExecutor(threads) as pool:
        parts = pool.map(lambda chunk: [_share(layer) for layer in chunk], chunks)
        return [share for part in parts for share in part]


def shared_inputs(layer: Layer) -> tuple | None:
    """(rep_ptr, rep_indices, members, member_ptr) of a uniform fixed-degree layer
    whose outputs share their input lists (each list read by two outputs or more on
    average), else None: the distinct lists ordered by their bytes and, for each,
    the outputs that read it in increasing order (see ``cpu_kernels``: one sum per
    list, the same bits)."""
    return shared_inputs_all([layer])[0]

