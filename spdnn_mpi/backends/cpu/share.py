"""Which outputs of a layer read the same input list: the CPU backend's shared sums.

In a uniform fixed-degree layer (every RadiX-Net layer of the challenge)
many outputs read exactly the same inputs, so the backend sums each distinct
input list once (see ``cpu_kernels``). Finding them was ``np.unique`` over
the rows' bytes per layer, 0.2 ms a layer: a third of a second at 1920
layers, longer than the inference it prepares. One numba kernel now hashes
the rows of a layer, confirms equal rows exactly, and orders the distinct
lists as that ``np.unique`` did (by their bytes, as ``memcmp`` compares
them), so the result arrays are the same. It takes a run of layers of one
shape at a time (a packed store's indices seen as one array, no copy), the
runs spread over the threads: one call a layer had cost more in Python than
the looking itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spdnn_mpi.model import Layer, stacked_indices
from spdnn_mpi.util import jitcache

numba = jitcache.load_numba(__file__)  # before the @njit(cache=True) below
njit = numba.njit

#: Outputs of the layers looked at in one call.
RUN_ROWS = 1 << 22
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
    table = np.full(size, -1, dtype=np.int64)
    heads = np.empty(n, dtype=np.int64)
    group_of = np.empty(n, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)  # each group's latest row
    n_groups = 0
    stride = 0  # rows between the previous row and the row before it in its group
    for r in range(n):
        # lists that repeat every few rows (a RadiX-Net layer's do): the row as far
        # back as the last row's match lay is compared first, and only a row unlike
        # it is hashed (grouping the real network's layers: 8.5 against 11.5 ms a
        # thousand layers, the hashing 9.5 of those 11.5)
        if stride > 0 and r >= stride:
            same = True
            for c in range(w):
                if words[r - stride, c] != words[r, c]:
                    same = False
                    break
            if same:
                g = group_of[r - stride]
                group_of[r] = g
                last[g] = r
                continue
        h = np.uint64(0)
        for c in range(w):
            h += (np.uint64(words[r, c]) ^ _SALT) * weight[c]
        h ^= h >> np.uint64(29)
        h *= _MIX
        h ^= h >> np.uint64(32)
        hashes[r] = h
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
        g = group_of[r]
        stride = r - last[g] if last[g] >= 0 else 0
        last[g] = r
        if 2 * n_groups > n:
            return -1, group_of, heads
    return n_groups, group_of, heads[:n_groups]


@njit(cache=True, nogil=True)
def _lists_of_layer(rows, row_bytes, group_of, heads, reps, members, member_ptr):
    """Fill ``reps`` (the distinct lists in byte order), ``members`` (each list's
    outputs in increasing order, list after list) and ``member_ptr`` of one layer
    from its groups (``heads``: each group's first row)."""
    n_groups = len(heads)
    order = _sort_rows(heads, row_bytes)  # head rows in byte order
    rank = np.empty(n_groups, dtype=np.int64)
    for i in range(n_groups):
        rank[group_of[order[i]]] = i
    member_ptr[:] = 0
    for r in range(len(rows)):
        member_ptr[rank[group_of[r]] + 1] += 1
    for g in range(n_groups):
        member_ptr[g + 1] += member_ptr[g]
    fill = member_ptr[:-1].copy()
    for r in range(len(rows)):  # ascending rows: each list's members in order
        g = rank[group_of[r]]
        members[fill[g]] = r
        fill[g] += 1
    for i in range(n_groups):
        reps[i] = rows[order[i]]


@njit(cache=True, nogil=True)
def _share_layers(rows3, words3, bytes3):
    """The shared input lists of layers of one shape: (lists per layer,
    -1 where a layer shares too little; reps (layers, n_out // 2, degree), each layer's
    distinct lists first; members (layers, n_out); member_ptr (layers, n_out // 2 + 2)).
    Pages of ``reps`` past a layer's lists are never touched."""
    n, n_out, d = rows3.shape
    counts = np.empty(n, dtype=np.int64)
    reps = np.empty((n, n_out // 2, d), dtype=rows3.dtype)
    members = np.empty((n, n_out), dtype=np.int64)
    member_ptr = np.empty((n, n_out // 2 + 2), dtype=np.int64)
    for k in range(n):
        n_groups, group_of, heads = _group_rows(words3[k])
        counts[k] = n_groups
        if n_groups >= 0:
            _lists_of_layer(rows3[k], bytes3[k], group_of, heads, reps[k, :n_groups],
                            members[k], member_ptr[k, :n_groups + 1])
    return counts, reps, members, member_ptr


def _word_bytes(row_bytes: int) -> int:
    """The widest unsigned word (up to 8 bytes) that divides a row of ``row_bytes``."""
    return next(size for size in (8, 4, 2, 1) if row_bytes % size == 0)


def _words(rows3: np.ndarray) -> np.ndarray:
    """Each row's bytes as the widest unsigned words that divide them."""
    n_bytes = rows3.shape[2] * rows3.itemsize
    size = _word_bytes(n_bytes)
    return rows3.view(np.dtype(f"u{size}")).reshape(*rows3.shape[:2], n_bytes // size)


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


def _kind(layer: Layer) -> tuple | None:
    """Layers of one kind are looked at together: (n_out, degree, index dtype), or None
    where ``layer`` cannot share sums."""
    d = _shared_degree(layer)
    return (layer.n_out, d, np.asarray(layer.indices).dtype) if d else None


def _share_run(layers: Sequence[Layer]) -> list[tuple | None]:
    """:func:`shared_inputs` of layers of one kind, in one call."""
    rows3 = np.ascontiguousarray(stacked_indices(layers))
    counts, reps, members, member_ptr = _share_layers(
        rows3, _words(rows3), rows3.view(np.uint8).reshape(*rows3.shape[:2], -1))
    d = rows3.shape[2]
    rep_ptr = np.arange(0, d * (int(counts.max()) + 1), d, dtype=np.int64)
    return [None if g < 0 else (rep_ptr[:g + 1], reps[k, :g].ravel(), members[k],
                                member_ptr[k, :g + 1]) for k, g in enumerate(counts.tolist())]


def shared_inputs_all(layers: Sequence[Layer], threads: int | None = None) -> list[tuple | None]:
    """:func:`shared_inputs` of every layer: runs of consecutive layers of one kind (at
    most ``RUN_ROWS`` outputs, and at least ``threads`` runs where there are as many
    layers) in one call each, the calls over ``threads`` threads (default: numba's; the
    kernel runs without the GIL)."""
    threads = numba.get_num_threads() if threads is None else max(1, threads)
    layers = list(layers)
    kinds = [_kind(layer) for layer in layers]
    runs: list[tuple[int, int]] = []  # [start, stop) of layers of one kind
    k = 0
    while k < len(layers):
        j = k + 1
        if kinds[k] is not None:
            limit = max(1, min(RUN_ROWS // kinds[k][0], -(-len(layers) // threads)))
            while j < len(layers) and kinds[j] == kinds[k] and j - k < limit:
                j += 1
        runs.append((k, j))
        k = j

    def share_run(run: tuple[int, int]) -> list[tuple | None]:
        k, j = run
        return [None] * (j - k) if kinds[k] is None else _share_run(layers[k:j])

    if threads == 1 or len(runs) == 1:
        return [share for run in runs for share in share_run(run)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        return [share for part in pool.map(share_run, runs) for share in part]


def shared_inputs(layer: Layer) -> tuple | None:
    """(rep_ptr, rep_indices, members, member_ptr) of a uniform fixed-degree layer
    whose outputs share their input lists (each list read by two outputs or more on
    average), else None: the distinct lists ordered by their bytes and, for each,
    the outputs that read it in increasing order (see ``cpu_kernels``: one sum per
    list, the same bits)."""
    return shared_inputs_all([layer])[0]

