"""Official Sparse DNN Graph Challenge TSV files: strict, fast reading and writing.

Layout (all ids 1-based, tab-separated, each file plain or ``.gz``):

- ``neuron{N}/n{N}-l{k}.tsv``: ``i<TAB>j<TAB>value`` lines of W_k, ``i`` the
  input and ``j`` the output neuron of W(i, j);
- ``sparse-images-{N}.tsv``: ``image<TAB>pixel<TAB>value`` lines;
- ``neuron{N}-l{L}-categories.tsv``: one surviving image id per line.

Files are read block by block (never a whole tree, and a big file only one
block of text at a time) and parsed by a numba kernel that validates while it
reads: the first bad line stops the parse and becomes an
:class:`~spdnn_mpi.errors.InputFormatError` naming the file and line. The
kernels are compiled once and cached on disk (``cache=True``).

Writing produces the same layout (``%d<TAB>%d<TAB>%.6e`` lines, the order of
the official files), so generated data can be fed to other challenge codes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from spdnn_mpi.errors import InputFormatError
from spdnn_mpi.formats.tsv.counts import (  # noqa: F401 - STRAY_EMPTY_IMAGES re-exported
    STRAY_EMPTY_IMAGES,
    RowCounts,
    check_stray_id,
)
from spdnn_mpi.formats.tsv.kernels import (
    E_BLANK,
    E_COLUMNS,
    E_ID_HIGH,
    E_ID_LOW,
    E_NOT_INT,
    E_NOT_NUM,
    E_RANGE,
    coo_to_csr,
    duplicate_keys,
    parse_block,
    row_runs,
    scan_duplicates,
    scatter,
    sort_rows,
)
from spdnn_mpi.formats.tsv.text import (
    Source,
    check_rest_of_gzip,
    iter_text_blocks,
    open_text,
    source_name,
)
from spdnn_mpi.model import Layer, SparseRows, index_dtype

#: Bytes of (decompressed) text parsed per block; bounds the parser's memory.
BLOCK_BYTES = 1 << 24
#: Largest id the parser accepts when no bound is given (ids are kept as int32).
MAX_ID = (1 << 31) - 1

# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------
def _describe_error(path, err, names, max_a, max_b, buf) -> InputFormatError:
    code, line, fld, value, s, e = (int(x) for x in err)
    text = bytes(buf[s:e]).decode("utf-8", errors="replace")
    if len(text) > 80:
        text = text[:77] + "..."
    name = names[fld - 1] if fld else ""
    if code == E_COLUMNS:
        msg = f"expected {len(names)} tab-separated fields ({', '.join(names)}), found {value}"
    elif code == E_NOT_INT:
        msg = f"{name} is not an integer"
    elif code == E_NOT_NUM:
        msg = f"{name} is not a number"
    elif code == E_ID_LOW:
        msg = f"{name} {value} is not a 1-based id (ids start at 1; is the file 0-based?)"
    elif code == E_ID_HIGH:
        bound = max_a if fld == 1 else max_b
        msg = f"{name} {value} is beyond the {bound} allowed (file of a bigger network?)"
    elif code == E_BLANK:
        return InputFormatError(path, line, "blank line in the middle of the file")
    elif code == E_RANGE:
        msg = f"{name} is outside the float32 range"
    else:  # pragma: no cover - kernel and this table are kept in step
        msg = f"parse error {code}"
    return InputFormatError(path, line, f"{msg}: {text!r}")


def _parse_file(
    source: Source,
    ncols: int,
    max_a: int,
    max_b: int,
    names: tuple[str, ...],
    block_bytes: int = BLOCK_BYTES,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield per block the 0-based int32 ids ``a``, ``b`` and float32 values.

    Raises InputFormatError at the first bad line. Entry ``k`` of the file
    (counting over blocks) is on line ``k + 1``: blank lines may only trail.
    """
    path = source_name(source)
    lines_done = [0]
    blank = 0
    err = np.zeros(6, dtype=np.int64)
    with open_text(source) as f:
        for buf in iter_text_blocks(f, path, block_bytes, lines_done):
            # every stored line has at least 2 * ncols bytes, the last one 2 * ncols - 1
            cap = buf.shape[0] // (2 * ncols) + 1
            out_a = np.empty(cap, dtype=np.int32)
            out_b = np.empty(cap if ncols == 3 else 0, dtype=np.int32)
            out_v = np.empty(cap if ncols == 3 else 0, dtype=np.float32)
            count, lines_done[0], blank = parse_block(
                buf, ncols, max_a, max_b, out_a, out_b, out_v, lines_done[0], blank, err
            )
            if err[0]:
                problem = _describe_error(path, err, names, max_a, max_b, buf)
                check_rest_of_gzip(f, path, problem, block_bytes)
                raise problem
            yield out_a[:count], out_b[:count], out_v[:count]


def _concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    if not parts:
        return np.empty(0, dtype=dtype)
    if len(parts) == 1:
        return np.ascontiguousarray(parts[0], dtype=dtype)
    return np.concatenate(parts).astype(dtype, copy=False)


def _duplicate_error(path, rows, cols, indptr, sorted_cols, n_cols, what) -> InputFormatError:
    """Locate the earliest repeated (row, col) pair; ``what(row, col)`` describes it."""
    keys = duplicate_keys(indptr, sorted_cols, n_cols)
    pos, first = scan_duplicates(rows, cols, n_cols, keys, np.full(len(keys), -1), 0)
    pair = what(int(rows[pos]) + 1, int(cols[pos]) + 1)
    return InputFormatError(
        path, int(pos) + 1, f"duplicate entry {pair}, already given on line {int(first) + 1}"
    )


_LAYER_FIELDS = ("input neuron i", "output neuron j", "value")
_IMAGE_FIELDS = ("image", "pixel", "value")
_CATEGORY_FIELDS = ("image id",)


def read_layer(
    path: Source,
    n_in: int,
    n_out: int,
    *,
    bias: float | np.ndarray = 0.0,
    clip: float | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> Layer:
    """Read one ``i j value`` layer file as a :class:`Layer` (CSR of W^T).

    Ids are checked against ``1..n_in`` (i) and ``1..n_out`` (j); duplicates,
    malformed lines and bad gzip data raise InputFormatError with the line.
    A layer whose values are all equal is kept as ``uniform_value``. ``path``
    may also be a :class:`~spdnn_mpi.formats.tsv.text.MemberText` (bytes read
    from an archive), named in errors as ``archive[member]``.
    """
    source, path = path, source_name(path)
    parts_i, parts_j, parts_v = [], [], []
    for a, b, v in _parse_file(source, 3, n_in, n_out, _LAYER_FIELDS, block_bytes):
        parts_i.append(a)
        parts_j.append(b)
        parts_v.append(v)
    i = _concat(parts_i, np.int32)
    j = _concat(parts_j, np.int32)
    v = _concat(parts_v, np.float32)
    del parts_i, parts_j, parts_v
    indptr, indices, values, dup = coo_to_csr(j, i, v, n_out)
    if dup:
        raise _duplicate_error(
            path, j, i, indptr, indices, n_in, lambda j1, i1: f"(i, j) = ({i1}, {j1})"
        )
    indices = indices.astype(index_dtype(n_in))
    if len(values) and np.all(values == values[0]):
        return Layer(n_in, n_out, indptr, indices, None, float(values[0]), bias, clip)
    return Layer(n_in, n_out, indptr, indices, values, None, bias, clip)


def read_images(
    path: str | os.PathLike,
    n_cols: int,
    n_rows: int | None = None,
    *,
    block_bytes: int = BLOCK_BYTES,
) -> SparseRows:
    """Read ``image pixel value`` lines as CSR input rows (values dropped when all 1).

    ``n_rows`` defaults to the largest image id in the file, unless that id is
    a likely stray (more empty images than non-empty ones, and more than
    ``STRAY_EMPTY_IMAGES``): then it is an error asking for ``n_rows``. Ids
    beyond a given ``n_rows`` or beyond ``n_cols`` pixels are errors. Memory stays near
    the size of the result whatever the line order: a file sorted by image
    then pixel is read in one pass that keeps only the pixel ids; any other
    order (such as pixel-major, as MATLAB's ``find`` writes) is counted in the
    same pass and placed in a second one, so no per-line image id array is
    ever held. A file with no entries (empty, or blank lines) is refused.
    """
    path = source_name(path)
    bound = MAX_ID if n_rows is None else n_rows
    idx_dtype = index_dtype(n_cols)

    def blocks():
        return _parse_file(path, 3, bound, n_cols, _IMAGE_FIELDS, block_bytes)

    # pass 1: row-major files finish here; others leave counts per image
    cols_parts: list[np.ndarray] = []
    vals_parts: list[np.ndarray | None] = []
    run_rows: list[np.ndarray] = []
    run_lens: list[np.ndarray] = []
    counts: RowCounts | None = None  # set once the order is broken
    binary = True
    prev_row, prev_col, done = -1, -1, 0
    for a, b, v in blocks():
        all_ones = bool(np.all(v == 1.0))
        binary = binary and all_ones
        if counts is None:
            rr, rl, brk, dup = row_runs(a, b, prev_row, prev_col)
            if dup:
                line = done + int(brk) + 1
                raise InputFormatError(
                    path,
                    line,
                    f"duplicate entry (image, pixel) = ({int(a[brk]) + 1}, {int(b[brk]) + 1}), "
                    f"already given on line {line - 1}",
                )
            if brk < 0:
                run_rows.append(rr)
                run_lens.append(rl)
                cols_parts.append(b.astype(idx_dtype))
                vals_parts.append(None if all_ones else v)
                if len(a):
                    prev_row, prev_col = int(a[-1]), int(b[-1])
                done += len(a)
                continue
            counts = RowCounts(bounded=n_rows is not None)
            for r, n in zip(run_rows, run_lens):
                counts.add(r, n)
            cols_parts, vals_parts, run_rows, run_lens = [], [], [], []
        counts.add(a)
        done += len(a)

    if done == 0:  # empty, or blank lines only: a store of no images is no input
        raise InputFormatError(path, None, "no images (the file has no entry lines)")
    if counts is None:
        rr = _concat(run_rows, np.int64)
        rl = _concat(run_lens, np.int64)
        if n_rows is None:
            n_rows = int(rr[-1]) + 1 if len(rr) else 0
            distinct = 1 + int(np.count_nonzero(np.diff(rr))) if len(rr) else 0
            check_stray_id(path, n_rows, distinct, blocks)
        indptr = np.zeros(n_rows + 1, dtype=np.int64)
        np.add.at(indptr, rr + 1, rl)
        np.cumsum(indptr, out=indptr)
        vals = None
        if not binary:
            vals = _concat(
                [
                    np.ones(len(c), np.float32) if p is None else p
                    for c, p in zip(cols_parts, vals_parts)
                ],
                np.float32,
            )
        del vals_parts
        return SparseRows(n_cols, indptr, _concat(cols_parts, idx_dtype), vals)

    # pass 2: place every entry at its row's next free slot
    used, distinct = counts.top_and_distinct()
    if n_rows is None:
        check_stray_id(path, used, distinct, blocks)
        n_rows = used
    counts = counts.counts()
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    indptr[1 : used + 1] = counts[:used]
    np.cumsum(indptr, out=indptr)
    del counts
    cols = np.empty(done, dtype=idx_dtype)
    vals = np.empty(0 if binary else done, dtype=np.float32)
    fill = indptr[:-1].copy()
    seen = 0
    for a, b, v in blocks():
        seen += len(a)
        if seen > done:
            break
        scatter(a, b, v, fill, cols, vals)
    if seen != done or not np.array_equal(fill, indptr[1:]):
        raise InputFormatError(path, None, "the file changed while it was being read")
    if sort_rows(indptr, cols, vals):
        # pass 3 (error path only): the earliest line repeating an (image, pixel) pair
        keys = duplicate_keys(indptr, cols, n_cols)
        first = np.full(len(keys), -1, dtype=np.int64)
        offset = 0
        for a, b, _ in blocks():
            pos, first_pos = scan_duplicates(a, b, n_cols, keys, first, offset)
            if pos >= 0:
                k = pos - offset
                raise InputFormatError(
                    path,
                    int(pos) + 1,
                    f"duplicate entry (image, pixel) = ({int(a[k]) + 1}, {int(b[k]) + 1}), "
                    f"already given on line {int(first_pos) + 1}",
                )
            offset += len(a)
    return SparseRows(n_cols, indptr, cols, None if binary else vals)


def read_categories(path: str | os.PathLike, n_images: int | None = None) -> np.ndarray:
    """Read a truth file: sorted 1-based image ids (int64), one per line.

    The file may be in any order but must not repeat an id; ids beyond
    ``n_images`` (when given) are errors. An empty file means no survivors.
    """
    path = source_name(path)
    bound = MAX_ID if n_images is None else n_images
    parts = [a for a, _, _ in _parse_file(path, 1, bound, 0, _CATEGORY_FIELDS)]
    ids = _concat(parts, np.int64) + 1
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    same = np.flatnonzero(s[1:] == s[:-1])
    if len(same):
        # earliest line that repeats an id seen before it
        later = np.maximum(order[same], order[same + 1])
        k = int(later.min())
        raise InputFormatError(path, k + 1, f"duplicate image id {int(ids[k])}")
    return s


