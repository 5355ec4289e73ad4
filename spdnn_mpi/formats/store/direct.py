"""A packed dataset's prefix read straight from the file's bytes, in parallel.

A schema 3 store keeps its layers in a few 1-D chunked datasets without filters,
so their bytes lie in the file as they lie in memory, chunk by chunk. Reading
them through HDF5 copies each chunk through its chunk cache on one thread (4096 x
1920, 554 MB from the page cache: 0.48 s); here the chunks' file offsets come
from HDF5's chunk index and runs of chunks that follow one another in the file
are read with ``os.preadv`` into the result, on several threads, which release
the GIL while they read. Any dataset this cannot read exactly (filters, a user
block, a chunk not written, an unusual layout) is read through HDF5 instead.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

from spdnn_mpi.errors import StoreError

#: Largest single read, in bytes (runs of chunks are cut at this size so that the
#: threads share the work).
READ_BYTES = 32 << 20


def _runs(ds: h5py.Dataset, stop: int) -> list[tuple[int, int, int]] | None:
    """(offset in the result, offset in the file, bytes) covering ds[:stop], merged
    where chunks follow one another in both; None where they cannot be read raw."""
    if (ds.ndim != 1 or ds.chunks is None or not hasattr(ds.id, "chunk_iter")
            or ds.id.get_create_plist().get_nfilters() or ds.file.userblock_size):
        return None
    chunk = ds.chunks[0]
    item = ds.dtype.itemsize
    found: list[tuple[int, int, int, int]] = []

    def note(info) -> None:
        found.append((info.chunk_offset[0], info.byte_offset, info.size, info.filter_mask))

    ds.id.chunk_iter(note)
    found.sort()
    needed = -(-stop // chunk)
    if len(found) < needed or any(found[i][0] != i * chunk for i in range(needed)):
        return None  # a chunk never written reads as the fill value: HDF5 knows it
    runs: list[list[int]] = []
    for first, byte_offset, size, mask in found[:needed]:
        if mask or size != chunk * item:
            return None
        length = (min(stop, first + chunk) - first) * item
        last = runs[-1] if runs else None
        if (last is not None and last[1] + last[2] == byte_offset
                and last[0] + last[2] == first * item and last[2] + length <= READ_BYTES):
            last[2] += length
        else:
            runs.append([first * item, byte_offset, length])
    return [tuple(r) for r in runs]


def read_prefix(ds: h5py.Dataset, stop: int, threads: int) -> np.ndarray | None:
    """``ds[:stop]`` read from the file's bytes on ``threads`` threads, or None where
    the dataset cannot be read so (the caller reads it through HDF5). A short read
    (a truncated file) is a StoreError."""
    if stop <= 0 or ds.dtype.hasobject:
        return None
    runs = _runs(ds, stop)
    if runs is None:
        return None
    out = np.empty(stop, dtype=ds.dtype)
    view = memoryview(out.view(np.uint8))
    fd = os.open(ds.file.filename, os.O_RDONLY)
    try:
        def read(run: tuple[int, int, int]) -> None:
            at, offset, size = run
            done = os.preadv(fd, [view[at:at + size]], offset)
            if done != size:
                raise StoreError(f"{ds.file.filename}: {ds.name[1:]}: {size} bytes at "
                                 f"{offset} asked for, {done} read; the file is truncated")

        if threads > 1 and len(runs) > 1:
            with ThreadPoolExecutor(min(threads, len(runs))) as pool:
                list(pool.map(read, runs))
        else:
            for run in runs:
                read(run)
    finally:
        os.close(fd)
    return out
