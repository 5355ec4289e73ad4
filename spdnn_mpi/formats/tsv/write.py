"""Writing the official TSV layout (``%d<TAB>%d<TAB>%.6e`` lines, the official order).

Generated data written this way can be fed to other challenge codes; every
file is written atomically and round-trips losslessly through the readers.
"""

from __future__ import annotations

import gzip
import itertools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Layer, Network, SparseRows
from spdnn_mpi.util.atomic import atomic_path


def _value_table(values: np.ndarray | None, uniform: float | None, one_as_int: bool):
    """(val_idx, table bytes, offsets): each distinct value formatted once, with its newline.

    ``%.6e`` like the official files; a value that would not read back
    exactly as float32 gets ``%.8e`` so written files round-trip losslessly.
    Formatting goes through C-level ``%`` on whole lists, not a loop per line.
    """
    if values is None:
        uniq = np.array([uniform], dtype=np.float32)
        inv = np.empty(0, dtype=np.int32)
    else:
        uniq, inv = np.unique(np.asarray(values, dtype=np.float32), return_inverse=True)
        inv = inv.astype(np.int32).ravel()
    as_list = uniq.astype(np.float64).tolist()
    parts = (("%.6e\n" * len(as_list)) % tuple(as_list)).split("\n")[:-1]
    back = np.array(parts, dtype=np.float64).astype(np.float32)
    bad = np.flatnonzero(back != uniq)
    if len(bad):
        exact = (("%.8e\n" * len(bad)) % tuple(uniq[bad].astype(np.float64).tolist())).split("\n")
        obj = np.array(parts, dtype=object)
        obj[bad] = exact[:-1]
        parts = obj.tolist()
    if one_as_int:
        ones = np.flatnonzero(uniq == 1.0)
        if len(ones):
            parts[int(ones[0])] = "1"
    buf = np.frombuffer(("\n".join(parts) + "\n").encode(), dtype=np.uint8)
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.flatnonzero(buf == 10) + 1
    return inv, buf, offsets


def _write_csr_lines(
    path: Path,
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray | None,
    uniform: float | None,
    *,
    swap: bool,
    row_base: int,
    one_as_int: bool,
    block_entries: int = 1 << 22,
) -> None:
    """Write CSR entries as TSV lines atomically (gzip when the name ends in .gz)."""
    # numba on first use: writing categories alone (every `spdnn infer`) never loads it
    from spdnn_mpi.formats.tsv.kernels import format_block

    val_idx, table, offsets = _value_table(values, uniform, one_as_int)
    n_rows = len(indptr) - 1
    n_cols_bound = int(indices.max()) + 1 if len(indices) else 1
    width = len(str(row_base + n_rows)) + len(str(n_cols_bound)) + int(np.max(np.diff(offsets))) + 2
    indptr = np.asarray(indptr, dtype=np.int64)
    with atomic_path(path) as tmp:
        opener = gzip.open if path.name.endswith(".gz") else open
        kwargs = {"compresslevel": 6} if opener is gzip.open else {}
        with opener(tmp, "wb", **kwargs) as f:
            r = 0
            while r < n_rows:
                # rows [r, r2) holding at most block_entries entries (at least one row)
                r2 = int(np.searchsorted(indptr, indptr[r] + block_entries, side="right")) - 1
                r2 = min(max(r2, r + 1), n_rows)
                n_entries = int(indptr[r2] - indptr[r])
                out = np.empty(n_entries * width, dtype=np.uint8)
                used = format_block(
                    indptr, indices, r, r2, row_base, swap, val_idx, table, offsets, out
                )
                f.write(memoryview(out[:used]))
                r = r2


def write_layer(path: str | os.PathLike, layer: Layer) -> None:
    """Write a layer as official ``i j value`` lines (ordered by j, then i), atomically."""
    _write_csr_lines(
        Path(path),
        layer.indptr,
        layer.indices,
        layer.values,
        layer.uniform_value,
        swap=True,
        row_base=0,
        one_as_int=False,
    )


def write_images(path: str | os.PathLike, rows: SparseRows) -> None:
    """Write input rows as ``image pixel value`` lines (image ids from ``first_row + 1``)."""
    indptr = np.asarray(rows.indptr, dtype=np.int64) - int(rows.indptr[0])
    _write_csr_lines(
        Path(path),
        indptr,
        rows.indices,
        rows.values,
        1.0 if rows.values is None else None,
        swap=False,
        row_base=rows.first_row,
        one_as_int=True,
    )


def categories_text(ids: np.ndarray) -> bytes:
    """Sorted 1-based image ids, one per line (the official categories format)."""
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    if len(ids) and ids[0] < 1:
        raise ValueError("category ids are 1-based")
    return "".join(f"{x}\n" for x in ids.tolist()).encode()


def predictions_text(classes: np.ndarray) -> bytes:
    """``image_id<TAB>class`` lines (1-based id, 0-based class)."""
    classes = np.asarray(classes, dtype=np.int64)
    ids = np.arange(1, len(classes) + 1)
    return "".join(f"{i}\t{c}\n" for i, c in zip(ids.tolist(), classes.tolist())).encode()


def write_categories(path: str | os.PathLike, ids: np.ndarray) -> None:
    """Write sorted 1-based image ids, one per line, atomically."""
    write_text(path, categories_text(ids))


def write_text(path: str | os.PathLike, text: bytes) -> None:
    """``text`` to ``path`` atomically, gzip-compressed when the name ends in .gz."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if path.name.endswith(".gz"):
            with gzip.open(tmp, "wb") as f:
                f.write(text)
        else:
            tmp.write_bytes(text)


def write_tree(
    out_dir: str | os.PathLike,
    network: Network | Iterable[Layer],
    rows: SparseRows | None = None,
    categories_by_L: Mapping[int, np.ndarray] | None = None,
    *,
    compress: bool = False,
) -> dict[str, Path]:
    """Write the official layout under ``out_dir`` and return what was written.

    ``neuron{N}/n{N}-l{k}.tsv`` for each layer (taken one at a time, so a
    generator of layers streams), ``sparse-images-{N}.tsv`` when ``rows`` is
    given, ``neuron{N}-l{L}-categories.tsv`` per truth entry. The layer folder
    is built under a temporary name and renamed when complete; every other
    file is written atomically. ``compress`` adds ``.gz``. Layers must be
    square N x N, as the official names carry only N.
    """
    out_dir = Path(out_dir)
    layers = network.layers if isinstance(network, Network) else network
    ext = ".tsv.gz" if compress else ".tsv"
    written: dict[str, Path] = {}
    it = iter(layers)
    first = next(it, None)
    if first is None:
        raise SpdnnError("write_tree: the network has no layers")
    neurons = first.n_in
    if rows is not None and rows.n_cols != neurons:
        raise SpdnnError(f"write_tree: inputs have {rows.n_cols} columns, network N={neurons}")
    final = out_dir / f"neuron{neurons}"
    with atomic_path(final, directory=True) as tmp:
        k = 0
        for layer in itertools.chain([first], it):
            k += 1
            if layer.n_in != neurons or layer.n_out != neurons:
                raise SpdnnError(
                    f"write_tree: layer {k} is {layer.n_in} x {layer.n_out}; the official "
                    f"layout needs every layer {neurons} x {neurons}"
                )
            write_layer(tmp / f"n{neurons}-l{k}{ext}", layer)
    written["weights"] = final
    if rows is not None:
        p = out_dir / f"sparse-images-{neurons}{ext}"
        write_images(p, rows)
        written["images"] = p
    for n_layers, ids in sorted((categories_by_L or {}).items()):
        p = out_dir / f"neuron{neurons}-l{n_layers}-categories{ext}"
        write_categories(p, ids)
        written[f"categories_l{n_layers}"] = p
    return written
