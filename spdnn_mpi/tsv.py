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

import gzip
import itertools
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spdnn_mpi.atomic import atomic_path
from spdnn_mpi.errors import InputFormatError, SpdnnError
from spdnn_mpi.model import Layer, Network, SparseRows, index_dtype
from spdnn_mpi.tsv_kernels import (
    E_BLANK,
    E_COLUMNS,
    E_ID_HIGH,
    E_ID_LOW,
    E_NOT_INT,
    E_NOT_NUM,
    E_RANGE,
    coo_to_csr,
    duplicate_keys,
    format_block,
    parse_block,
    row_runs,
    scan_duplicates,
    scatter,
    sort_rows,
)

#: Bytes of (decompressed) text parsed per block; bounds the parser's memory.
BLOCK_BYTES = 1 << 24
#: Largest id the parser accepts when no bound is given (ids are kept as int32).
MAX_ID = (1 << 31) - 1

LAYER_RE = re.compile(r"^n(\d+)-l(\d+)\.tsv(\.gz)?$")
IMAGES_RE = re.compile(r"^sparse-images-(\d+)\.tsv(\.gz)?$")
CATEGORIES_RE = re.compile(r"^neuron(\d+)-l(\d+)-categories\.tsv(\.gz)?$")

# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------
def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _open_checked(path: Path):
    if not path.exists():
        raise InputFormatError(path, None, "no such file")
    if path.is_dir():
        raise InputFormatError(path, None, "is a directory, expected a file")
    try:
        return gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb")
    except OSError as exc:
        raise InputFormatError(path, None, f"cannot open: {exc.strerror or exc}") from None


_GZIP_ERRORS = (EOFError, OSError, zlib.error)


def _gzip_error(path: Path, line: int, exc: BaseException, detail: str = "") -> InputFormatError:
    what = "truncated" if isinstance(exc, EOFError) else "corrupt"
    return InputFormatError(
        path, line, f"{what} gzip data ({exc}){detail}; re-download or re-compress the file"
    )


def _iter_text_blocks(
    f, path: Path, block_bytes: int, lines_done: list[int]
) -> Iterator[np.ndarray]:
    """Blocks of bytes from open file ``f`` ending at a line break (except the last).

    ``lines_done[0]`` (kept up to date by the caller) places a decompression
    error on a line.
    """
    gz = isinstance(f, gzip.GzipFile)
    rest = b""
    while True:
        try:
            data = f.read(block_bytes)
        except _GZIP_ERRORS as exc:
            if gz:
                raise _gzip_error(path, lines_done[0] + 1 + rest.count(b"\n"), exc) from None
            raise InputFormatError(path, None, f"read error: {exc}") from None
        if not data:
            break
        if rest:
            data = rest + data
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        yield np.frombuffer(data, dtype=np.uint8, count=cut + 1)
        rest = data[cut + 1 :]
    if rest:
        yield np.frombuffer(rest, dtype=np.uint8)


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
    path: str | os.PathLike,
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
    path = Path(path)
    lines_done = [0]
    blank = 0
    err = np.zeros(6, dtype=np.int64)
    with _open_checked(path) as f:
        for buf in _iter_text_blocks(f, path, block_bytes, lines_done):
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
                _check_rest_of_gzip(f, path, problem, block_bytes)
                raise problem
            yield out_a[:count], out_b[:count], out_v[:count]


def _check_rest_of_gzip(f, path: Path, problem: InputFormatError, block_bytes: int) -> None:
    """A bad line in a gzip file may be garbage from corrupt data: say so if it is.

    Corruption often decodes to plausible bytes until the CRC check at the
    end, so the rest of the stream is decompressed (and dropped) to find out.
    """
    if not isinstance(f, gzip.GzipFile):
        return
    try:
        while f.read(block_bytes):
            pass
    except _GZIP_ERRORS as exc:
        detail = f"; the first bad line is {problem.line}: {problem.message}"
        raise _gzip_error(path, problem.line, exc, detail) from None


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
    path: str | os.PathLike,
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
    A layer whose values are all equal is kept as ``uniform_value``.
    """
    path = Path(path)
    parts_i, parts_j, parts_v = [], [], []
    for a, b, v in _parse_file(path, 3, n_in, n_out, _LAYER_FIELDS, block_bytes):
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

    ``n_rows`` defaults to the largest image id in the file; ids beyond a
    given ``n_rows`` or beyond ``n_cols`` pixels are errors. Memory stays near
    the size of the result whatever the line order: a file sorted by image
    then pixel is read in one pass that keeps only the pixel ids; any other
    order (such as pixel-major, as MATLAB's ``find`` writes) is counted in the
    same pass and placed in a second one, so no per-line image id array is
    ever held.
    """
    path = Path(path)
    bound = MAX_ID if n_rows is None else n_rows
    idx_dtype = index_dtype(n_cols)

    def blocks():
        return _parse_file(path, 3, bound, n_cols, _IMAGE_FIELDS, block_bytes)

    # pass 1: row-major files finish here; others leave counts per image
    cols_parts: list[np.ndarray] = []
    vals_parts: list[np.ndarray | None] = []
    run_rows: list[np.ndarray] = []
    run_lens: list[np.ndarray] = []
    counts: np.ndarray | None = None  # set once the order is broken
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
            counts = np.zeros(0, dtype=np.int64)
            for r, n in zip(run_rows, run_lens):
                counts = _add_counts(counts, r, n)
            cols_parts, vals_parts, run_rows, run_lens = [], [], [], []
        counts = _add_counts(counts, a, None)
        done += len(a)

    if counts is None:
        rr = _concat(run_rows, np.int64)
        rl = _concat(run_lens, np.int64)
        if n_rows is None:
            n_rows = int(rr[-1]) + 1 if len(rr) else 0
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
    nonzero = np.flatnonzero(counts)
    used = int(nonzero[-1]) + 1 if len(nonzero) else 0
    if n_rows is None:
        n_rows = used
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


def _add_counts(counts: np.ndarray, rows: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
    """``counts[r] += lengths`` (or 1) for each r in ``rows``, growing ``counts`` as needed."""
    if not len(rows):
        return counts
    top = int(rows.max()) + 1
    if top > len(counts):
        grown = np.zeros(max(top, 2 * len(counts)), dtype=np.int64)
        grown[: len(counts)] = counts
        counts = grown
    counts[:top] += np.bincount(rows, weights=lengths, minlength=top).astype(np.int64)
    return counts


def read_categories(path: str | os.PathLike, n_images: int | None = None) -> np.ndarray:
    """Read a truth file: sorted 1-based image ids (int64), one per line.

    The file may be in any order but must not repeat an id; ids beyond
    ``n_images`` (when given) are errors. An empty file means no survivors.
    """
    path = Path(path)
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


# ---------------------------------------------------------------------------
# locating files
# ---------------------------------------------------------------------------
def layer_path(directory: str | os.PathLike, neurons: int, k: int) -> Path:
    """Path of 1-based layer ``k`` in a ``neuron{N}`` folder: ``.tsv``, else ``.tsv.gz``.

    Raises InputFormatError (naming the expected file) when neither exists.
    """
    base = Path(directory) / f"n{neurons}-l{k}.tsv"
    for p in (base, base.with_name(base.name + ".gz")):
        if p.is_file():
            return p
    raise InputFormatError(base, None, f"missing layer file (no {base.name} or {base.name}.gz)")


def layer_files(directory: str | os.PathLike) -> dict[int, dict[int, Path]]:
    """All ``n{N}-l{k}.tsv[.gz]`` files of a folder: ``{N: {k: path}}`` (.tsv wins)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputFormatError(directory, None, "no such weights folder")
    found: dict[int, dict[int, Path]] = {}
    for p in sorted(directory.iterdir(), key=lambda q: q.name.endswith(".gz")):
        m = LAYER_RE.match(p.name)
        if m:
            found.setdefault(int(m.group(1)), {}).setdefault(int(m.group(2)), p)
    return found


def count_layers(directory: str | os.PathLike, neurons: int) -> int:
    """Number of consecutive layer files ``1..L`` present for ``neurons``."""
    files = layer_files(directory).get(neurons, {})
    n = 0
    while n + 1 in files:
        n += 1
    return n


def infer_neurons(directory: str | os.PathLike) -> int:
    """N of a weights folder, from its name ``neuron{N}`` or its layer file names."""
    directory = Path(directory)
    m = re.fullmatch(r"neuron(\d+)", directory.name)
    if m:
        return int(m.group(1))
    ns = sorted(layer_files(directory))
    if len(ns) == 1:
        return ns[0]
    if not ns:
        raise InputFormatError(directory, None, "no n{N}-l{k}.tsv layer files found")
    raise InputFormatError(
        directory, None, f"layer files of several N ({ns}); pass the number of neurons"
    )


def iter_layers(
    directory: str | os.PathLike,
    neurons: int,
    n_layers: int,
    *,
    bias: float | np.ndarray = 0.0,
    clip: float | None = None,
    check_full: bool = True,
) -> Iterator[Layer]:
    """Read layers ``1..n_layers`` of a ``neuron{N}`` folder one at a time.

    With ``check_full`` (challenge networks) every layer must use input and
    output neuron N somewhere, so a layer of a smaller network copied into
    the folder is caught even though all its ids are in range.
    """
    for k in range(1, n_layers + 1):
        path = layer_path(directory, neurons, k)
        layer = read_layer(path, neurons, neurons, bias=bias, clip=clip)
        if check_full:
            top_in = int(layer.indices.max()) + 1 if layer.nnz else 0
            nonempty = np.flatnonzero(np.diff(layer.indptr))
            top_out = int(nonempty[-1]) + 1 if len(nonempty) else 0
            if top_in != neurons or top_out != neurons:
                raise InputFormatError(
                    path,
                    None,
                    f"layer uses neurons up to i={top_in}, j={top_out} but the network "
                    f"has N={neurons}: it belongs to a different network",
                )
        yield layer


@dataclass
class TreeNetwork:
    """What an official tree holds for one N (see :func:`scan_tree`)."""

    neurons: int
    weights_dir: Path
    n_layers: int
    images: Path | None = None
    categories: dict[int, Path] = field(default_factory=dict)


def scan_tree(root: str | os.PathLike) -> list[TreeNetwork]:
    """Find every network in an official tree (searched recursively), sorted by N.

    A network is a ``neuron{N}`` folder with layer files ``1..L``; the images
    ``sparse-images-{N}.tsv[.gz]`` and truth ``neuron{N}-l{L}-categories.tsv``
    may sit anywhere under ``root``.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputFormatError(root, None, "no such folder")
    nets: dict[int, TreeNetwork] = {}
    images: dict[int, Path] = {}
    cats: dict[int, dict[int, Path]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        d = Path(dirpath)
        m = re.fullmatch(r"neuron(\d+)", d.name)
        if m and int(m.group(1)) not in nets:
            n = int(m.group(1))
            count = count_layers(d, n)
            if count:
                nets[n] = TreeNetwork(n, d, count)
        for name in sorted(filenames):
            if (mi := IMAGES_RE.match(name)) and int(mi.group(1)) not in images:
                images[int(mi.group(1))] = d / name
            elif mc := CATEGORIES_RE.match(name):
                cats.setdefault(int(mc.group(1)), {}).setdefault(int(mc.group(2)), d / name)
    for n, net in nets.items():
        net.images = images.get(n)
        net.categories = dict(sorted(cats.get(n, {}).items()))
    return [nets[n] for n in sorted(nets)]


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------
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


def write_categories(path: str | os.PathLike, ids: np.ndarray) -> None:
    """Write sorted 1-based image ids, one per line, atomically."""
    ids = np.sort(np.asarray(ids, dtype=np.int64))
    if len(ids) and ids[0] < 1:
        raise ValueError("category ids are 1-based")
    text = "".join(f"{x}\n" for x in ids.tolist()).encode()
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
