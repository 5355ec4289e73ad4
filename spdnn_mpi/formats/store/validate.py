"""Checks on a store's file, arrays and attributes, made once when read and before written.

The kernels trust their index arrays (an index out of range is a segfault or a
wrong answer), so every array read passes here first, as whole-array NumPy
reductions. A failure is a :class:`StoreError` naming ``where`` (store and dataset).
"""

from __future__ import annotations

import itertools
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import StoreError
from spdnn_mpi.model import ACTIVATIONS, Layer, index_dtype, joined_prefix
from spdnn_mpi.util.outputs import file_kind


def is_integer(value) -> bool:
    """True for an integer scalar (Python or NumPy), not a bool, float or string."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def shown(value) -> str:
    """``repr`` of an attribute value, NumPy scalars as plain numbers (1.5, not np.float64)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _is_real(value) -> bool:
    return is_integer(value) or isinstance(value, float | np.floating)


def integer_attr(where: str, attrs: Mapping, name: str, minimum: int = 0) -> int:
    """Attribute ``name`` as an int: present, an integer type (not "1", 1.5 or True), >= minimum."""
    if name not in attrs:
        raise StoreError(f"{where}: attribute {name} missing")
    value = attrs[name]
    if not is_integer(value):
        raise StoreError(f"{where}: attribute {name} is {shown(value)}, expected an integer")
    if int(value) < minimum:
        raise StoreError(f"{where}: attribute {name} is {int(value)}, expected >= {minimum}")
    return int(value)


def real_attr(where: str, attrs: Mapping, name: str) -> float:
    """Attribute ``name`` as a finite float (an integer or float type, not a string)."""
    value = attrs[name]
    if not _is_real(value) or not math.isfinite(float(value)):
        raise StoreError(f"{where}: attribute {name} is {shown(value)}, expected a finite number")
    return float(value)


def clip_attr(where: str, attrs: Mapping) -> float | None:
    """The ``clip`` attribute: absent (no clip) or a finite number > 0 (inf is refused:
    a clip beyond float32's range must not silently mean none)."""
    if "clip" not in attrs:
        return None
    value = attrs["clip"]
    if not _is_real(value) or not (math.isfinite(float(value)) and float(value) > 0):
        raise StoreError(f"{where}: attribute clip is {shown(value)}, expected a finite "
                         "number > 0")
    return float(value)


def check_one_dimension(where: str, name: str, shape: tuple) -> None:
    """A dataset of ``shape`` is a vector; checked before its dtype, so that a 2-D array
    of the right dtype is called a shape problem."""
    if len(shape) != 1:
        raise StoreError(f"{where}/{name}: shape {tuple(shape)}, expected one dimension")


def check_vector(where: str, name: str, array: np.ndarray, dtype, length: int) -> None:
    """``array`` (dataset ``name``) is one-dimensional, ``length`` long, of ``dtype`` exactly."""
    dtype = np.dtype(dtype)
    if array.ndim != 1 or array.shape[0] != length:
        raise StoreError(f"{where}/{name}: shape {array.shape}, expected ({length},)")
    if array.dtype != dtype:
        raise StoreError(f"{where}/{name}: dtype {array.dtype}, the schema says {dtype}")


def check_row_pointer(where: str, name: str, indptr: np.ndarray, n_rows: int, nnz: int,
                      first: int = 0) -> None:
    """A CSR row pointer: int64, ``n_rows + 1`` long, from ``first`` to ``nnz``, never
    decreasing."""
    check_vector(where, name, indptr, np.int64, n_rows + 1)
    if int(indptr[0]) != first or int(indptr[-1]) != nnz:
        raise StoreError(f"{where}/{name}: runs from {int(indptr[0])} to {int(indptr[-1])}, "
                         f"expected {first} to {nnz}")
    if n_rows and np.diff(indptr).min() < 0:
        k = int(np.flatnonzero(np.diff(indptr) < 0)[0])
        raise StoreError(f"{where}/{name}: decreases at entry {k + 1} "
                         f"({int(indptr[k])} then {int(indptr[k + 1])})")


def check_row_pointer_slice(where: str, name: str, indptr: np.ndarray, total: int) -> None:
    """Part of a row pointer: int64, never decreasing, every value within ``[0, total]``."""
    check_one_dimension(where, name, indptr.shape)
    if indptr.dtype != np.int64:
        raise StoreError(f"{where}/{name}: dtype {indptr.dtype}, the schema says int64")
    if len(indptr) > 1 and np.diff(indptr).min() < 0:
        k = int(np.flatnonzero(np.diff(indptr) < 0)[0])
        raise StoreError(f"{where}/{name}: decreases ({int(indptr[k])} then "
                         f"{int(indptr[k + 1])})")
    if len(indptr) and (int(indptr[0]) < 0 or int(indptr[-1]) > total):
        raise StoreError(f"{where}/{name}: values {int(indptr[0])}..{int(indptr[-1])} "
                         f"outside [0, {total}]")


def check_indices(where: str, name: str, indices: np.ndarray, extent: int,
                  exact: bool = True, in_range: bool = False) -> None:
    """Ids into ``[0, extent)``: of the documented dtype exactly, every value in range
    (``exact`` False: any integer dtype, for a writer's ids before the cast;
    ``in_range``: the values were already found in range, see ``indices_in_range``)."""
    dtype = index_dtype(extent)
    check_one_dimension(where, name, indices.shape)
    if (exact and indices.dtype != dtype) or not np.issubdtype(indices.dtype, np.integer):
        raise StoreError(f"{where}/{name}: dtype {indices.dtype}, the schema says {dtype} "
                         f"for ids below {extent}")
    if in_range or not len(indices):
        return
    top = int(indices.max())
    low = 0 if indices.dtype.kind == "u" else int(indices.min())
    if top >= extent or low < 0:
        bad = top if top >= extent else low
        k = int(np.flatnonzero(indices == bad)[0])
        raise StoreError(f"{where}/{name}: id {bad} at position {k} outside [0, {extent})")


def indices_in_range(extents: list[int], indices: list[np.ndarray], threads: int) -> list[bool]:
    """For each layer (its ``n_in`` and index array), True where its ids were found in
    ``[0, n_in)`` by one reduction over a run of layers whose arrays lie back to back
    in one buffer (a packed store's: ``model.joined_prefix``) with the same ``n_in``
    and documented dtype.

    One reduction over ``threads`` slices costs what streaming the ids costs, where
    one a layer cost about 8 us each besides (1920 layers of 1024 x 32: 12 against
    15 ms on one thread, 2-core VM, 2026-12-06). False leaves the layer to
    ``check_indices``, which names the first id out of range.
    """
    found = [False] * len(indices)
    k = 0
    while k < len(indices):
        extent, j = extents[k], k + 1
        if is_integer(extent) and extent >= 1 and indices[k].dtype == index_dtype(extent):
            while j < len(indices) and is_integer(extents[j]) and extents[j] == extent:
                j += 1
        count, run = joined_prefix(itertools.islice(indices, k, j))
        if count > 1 and _all_below(run, int(extent), threads):
            found[k:k + count] = [True] * count
        k += max(count, 1)
    return found


def _all_below(ids: np.ndarray, extent: int, threads: int) -> bool:
    """Every id in ``[0, extent)``, the array cut in ``threads`` slices reduced at once
    (NumPy's reductions release the GIL)."""
    if not len(ids):
        return True
    pieces = [p for p in np.array_split(ids, max(1, threads)) if len(p)]

    def ok(piece: np.ndarray) -> bool:
        return int(piece.max()) < extent and (ids.dtype.kind == "u" or int(piece.min()) >= 0)

    if len(pieces) == 1:
        return ok(pieces[0])
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(pieces)) as pool:
        return all(pool.map(ok, pieces))


def check_finite(where: str, name: str, array: np.ndarray) -> None:
    """Every value finite (no nan or inf); one float64 sum, which finite float32 cannot overflow."""
    if len(array) and not np.isfinite(np.sum(array, dtype=np.float64)):
        k = int(np.flatnonzero(~np.isfinite(array))[0])
        raise StoreError(f"{where}/{name}: value {array[k]} at position {k} is not finite")


def check_inputs_group(where: str, group, first_n_in: int) -> tuple[int, int, int]:
    """(n_rows, n_cols, nnz) of an ``inputs`` group, its attributes checked against its
    datasets (shapes and dtypes only: a rank's rows are checked when it reads them)."""
    n_rows = integer_attr(where, group.attrs, "n_rows", 0)
    n_cols = integer_attr(where, group.attrs, "n_cols", 1)
    for name in ("indptr", "indices"):
        if not hasattr(group.get(name), "dtype"):
            raise StoreError(f"{where}/{name}: dataset missing")
    ip, ind = group["indptr"], group["indices"]
    if ip.dtype != np.int64 or ip.shape != (n_rows + 1,):
        raise StoreError(f"{where}/indptr: {ip.dtype} of shape {ip.shape}, expected int64 "
                         f"of shape ({n_rows + 1},) for n_rows {n_rows}")
    want = index_dtype(n_cols)
    check_one_dimension(where, "indices", ind.shape)
    if ind.dtype != want:
        raise StoreError(f"{where}/indices: dtype {ind.dtype}, the schema says {want} "
                         f"for n_cols {n_cols}")
    nnz = int(ind.shape[0])
    has_values = "values" in group
    if has_values:
        vals = group["values"]
        if getattr(vals, "dtype", None) != np.float32 or vals.shape != (nnz,):
            raise StoreError(f"{where}/values: expected float32 of shape ({nnz},)")
    if "binary" in group.attrs and bool(group.attrs["binary"]) == has_values:
        raise StoreError(f"{where}: attribute binary is {bool(group.attrs['binary'])} but "
                         f"dataset values is {'present' if has_values else 'absent'}")
    if n_cols != first_n_in:
        raise StoreError(f"{where}: n_cols {n_cols} but layer 1 has {first_n_in} inputs")
    return n_rows, n_cols, nnz


def check_truth(where: str, ids: np.ndarray, n_images: int | None) -> None:
    """Truth ids: int64, strictly increasing (sorted, no repeats), 1-based, <= n_images."""
    if ids.ndim != 1:
        raise StoreError(f"{where}: shape {ids.shape}, expected one dimension")
    if ids.dtype != np.int64:
        raise StoreError(f"{where}: dtype {ids.dtype}, the schema says int64")
    if not len(ids):
        return
    if len(ids) > 1 and np.diff(ids).min() <= 0:
        raise StoreError(f"{where}: ids not strictly increasing")
    if int(ids[0]) < 1 or (n_images is not None and int(ids[-1]) > n_images):
        raise StoreError(f"{where}: ids {int(ids[0])}..{int(ids[-1])} outside "
                         f"1..{n_images if n_images is not None else 'any'}")


def check_classes(where: str, what: str, classes: np.ndarray, n_images: int | None,
                  n_classes: int, whose: str) -> None:
    """One class per image (``what``: labels or predictions), each in ``0..n_classes - 1``,
    ``n_classes`` being the outputs of ``whose`` ("the network", "layer 3")."""
    if classes.ndim != 1 or not np.issubdtype(classes.dtype, np.integer):
        raise StoreError(f"{where}: {what} must be a vector of integers")
    if n_images is not None and len(classes) != n_images:
        raise StoreError(f"{where}: {len(classes)} {what} for {n_images} images")
    if not len(classes):
        return
    low, top = int(classes.min()), int(classes.max())
    if low < 0 or top >= n_classes:
        bad = low if low < 0 else top
        k = int(np.flatnonzero(classes == bad)[0])
        raise StoreError(f"{where}: class {bad} of image {k + 1} outside 0..{n_classes - 1} "
                         f"({whose} has {n_classes} outputs)")


def check_layer(where: str, attrs: Mapping, indices: np.ndarray, indptr: np.ndarray | None,
                values: np.ndarray | None, bias_vec: np.ndarray | None,
                indices_in_range: bool = False) -> Layer:
    """The layer a group's attributes and arrays describe, every rule of the schema checked
    (the writer runs it too, so it never stores what the reader would refuse).

    ``indptr`` None: the ``row_degree`` form; ``values`` None: ``uniform_value``;
    ``bias_vec`` None: a scalar (or absent) bias; ``indices_in_range``: the index
    values were found below ``n_in`` already (``indices_in_range``).
    """
    n_in = integer_attr(where, attrs, "n_in", 1)
    n_out = integer_attr(where, attrs, "n_out", 1)
    nnz = integer_attr(where, attrs, "nnz", 0)
    check_indices(where, "indices", indices, n_in, in_range=indices_in_range)
    if len(indices) != nnz:
        raise StoreError(f"{where}/indices: {len(indices)} ids, attribute nnz says {nnz}")
    degree = None
    if indptr is None:
        degree = integer_attr(where, attrs, "row_degree", 0)
        if degree * n_out != nnz:
            raise StoreError(f"{where}: row_degree {degree} x {n_out} rows != nnz {nnz}")
        indptr = np.arange(n_out + 1, dtype=np.int64) * degree
    else:
        check_row_pointer(where, "indptr", indptr, n_out, nnz)
    if (values is None) != ("uniform_value" in attrs):
        raise StoreError(f"{where}: needs exactly one of dataset values and "
                         "attribute uniform_value")
    uniform = None
    if values is not None:
        check_vector(where, "values", values, np.float32, nnz)
        check_finite(where, "values", values)
    else:
        uniform = real_attr(where, attrs, "uniform_value")
    if bias_vec is not None:
        if "bias" in attrs:
            raise StoreError(f"{where}: both a bias dataset and a bias attribute")
        check_vector(where, "bias", bias_vec, np.float32, n_out)
        check_finite(where, "bias", bias_vec)
        bias: float | np.ndarray = bias_vec
    else:
        bias = real_attr(where, attrs, "bias") if "bias" in attrs else 0.0
    clip = clip_attr(where, attrs)
    activation = str(attrs.get("activation", "relu"))  # schema 1: always ReLU
    if activation not in ACTIVATIONS:
        raise StoreError(f"{where}: activation {activation!r} is not one of "
                         f"{', '.join(ACTIVATIONS)}")
    try:
        layer = Layer(n_in, n_out, indptr, indices, values, uniform, bias, clip, activation)
    except ValueError as exc:
        raise StoreError(f"{where}: {exc}") from None
    if degree is not None:  # the stored degree, not found again from indptr
        layer.row_degree = degree
    return layer


def simple_rows(table: np.ndarray) -> np.ndarray:
    """Which rows of a packed layer table (``layers.TABLE_DTYPE``) are in the simple form
    (a fixed degree, one weight value, a scalar bias) with every attribute rule of
    ``check_layer`` holding, found in one pass: their layers need only their index
    arrays checked (``simple_layer``): 1 us a layer against 7-9 (2-core VM, 2026-12-06)."""
    n_out, nnz, degree = table["n_out"], table["nnz"], table["row_degree"]
    clip = table["clip"]
    with np.errstate(invalid="ignore", over="ignore"):
        return ((table["n_in"] >= 1) & (n_out >= 1) & (nnz >= 0)
                & (degree >= 0) & (degree <= nnz) & (degree * n_out == nnz)
                & (table["indptr_start"] == -1)
                & (table["values_start"] == -1) & np.isfinite(table["uniform_value"])
                & (table["bias_start"] == -1) & np.isfinite(table["bias"])
                & ((table["has_clip"] == 0) | (np.isfinite(clip) & (clip > 0)))
                & (table["activation"] < len(ACTIVATIONS)))


def simple_layer(attrs: Mapping, indices: np.ndarray, in_range: bool,
                 indptrs: dict) -> Layer | None:
    """The layer ``check_layer`` would build from a row that ``simple_rows`` passed
    (``attrs``: the row as ``layers.row_attrs`` names it), or None where its index
    array breaks a rule (``check_layer`` then names it). ``indptrs`` holds the row
    pointers made so far, one per (n_out, degree), shared by the layers of that shape
    (nothing writes a layer's row pointer; left writeable, as numba types read-only
    arrays apart and would compile the CPU kernels again for them)."""
    n_in, n_out, degree = attrs["n_in"], attrs["n_out"], attrs["row_degree"]
    if (not in_range or indices.ndim != 1 or len(indices) != attrs["nnz"]
            or indices.dtype != index_dtype(n_in)):
        return None
    indptr = indptrs.get((n_out, degree))
    if indptr is None:
        indptr = indptrs[n_out, degree] = np.arange(n_out + 1, dtype=np.int64) * degree
    layer = Layer(n_in, n_out, indptr, indices, None, attrs["uniform_value"],
                  attrs["bias"], attrs.get("clip"), attrs["activation"])
    layer.row_degree = degree
    return layer


def check_store_file(path: Path) -> None:
    """Refuse a missing path, a directory, or anything else not a regular file (before
    HDF5 opens it: opening a FIFO blocks until a writer comes)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise StoreError(f"{path}: no such store") from None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise StoreError(f"{path}: is a directory, not a store")
    if not stat.S_ISREG(mode):
        raise StoreError(f"{path}: not a regular file ({file_kind(mode)}), not a store")
