"""Writing a store: atomically, one layer at a time, and safe when the disk fills up
(after a failed write h5py crashes the process on a later call, so HDF5 writes
through :class:`_GuardedFile`, which only remembers the failure).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from pathlib import Path

import h5py
import numpy as np

from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store import validate
from spdnn_mpi.formats.store.layers import PackedWriter
from spdnn_mpi.formats.store.schema import FORMAT_NAME, SCHEMA_VERSION, layer_key
from spdnn_mpi.model import READOUTS, Layer, SparseRows, index_dtype
from spdnn_mpi.util.atomic import atomic_path, write_error
from spdnn_mpi.util.signals import held_signals


def _libc_sync_file_range():
    """Linux's sync_file_range(2), which Python's os module lacks; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # pragma: no cover - a libc without it
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _libc_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


class _GuardedFile:
    """A file for h5py's ``fileobj`` driver that never reports a failed write to HDF5:
    later writes are dropped but counted as done, and ``error`` holds the failure.
    """

    def __init__(self, path: Path):
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        self._pos = 0
        self._end = 0  # the size HDF5 believes the file has
        self.error: OSError | None = None

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else (self._pos if whence == 1 else self._end) + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if self.error is None:
            done = 0
            try:
                while done < n:
                    written = os.pwrite(self._fd, view[done:], self._pos + done)
                    if written == 0:
                        raise OSError(28, os.strerror(28))
                    done += written
            except OSError as exc:
                self.error = exc
        self._pos += n
        self._end = max(self._end, self._pos)
        return n

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        got = os.preadv(self._fd, [view], self._pos) if self.error is None else 0
        view[got:] = bytes(len(view) - got)  # past what reached the disk: zeros
        self._pos += len(view)
        return len(view)

    def read(self, size: int) -> bytes:
        buf = bytearray(size)
        self.readinto(buf)
        return bytes(buf)

    def truncate(self, size: int | None = None) -> int:
        size = self._pos if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self._fd, size)
            except OSError as exc:
                self.error = exc
        self._end = size
        return size

    def flush(self) -> None:
        pass  # nothing is buffered here

    def start_writeback(self) -> None:
        """Have the kernel start writing what is written so far to the disk, without
        waiting for it. ext4 writes a file out before renaming it over an older one
        (or at close, after a truncation): 90 ms for a 139 MB store, in one process
        after the workers are done, against a share of it while they parse."""
        if self.error is None and _sync_file_range is not None:
            _sync_file_range(self._fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # a hint: result unused

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _stored_form(where: str, layer: Layer) -> tuple[dict, dict]:
    """(attributes, datasets) of ``layer`` as the store holds them, checked by the reader's
    rules; a dataset of None is not written (its attribute form is used)."""
    indices = np.asarray(layer.indices)
    validate.check_indices(where, "indices", indices, layer.n_in, exact=False)  # before a cast
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, refused below
        attrs: dict = {"n_in": layer.n_in, "n_out": layer.n_out, "nnz": len(indices),
                       "activation": layer.activation}
        arrays: dict = {"indices": indices.astype(index_dtype(layer.n_in), copy=False),
                        "indptr": None, "values": None, "bias": None}
        degree = layer.row_degree
        if degree is not None:
            attrs["row_degree"] = degree
        else:
            arrays["indptr"] = np.asarray(layer.indptr, dtype=np.int64)
        if layer.values is None:
            attrs["uniform_value"] = np.float32(layer.uniform_value)
        else:
            arrays["values"] = np.asarray(layer.values, dtype=np.float32)
        if layer.bias_is_scalar:
            attrs["bias"] = np.float32(layer.bias)
        else:
            arrays["bias"] = np.asarray(layer.bias, dtype=np.float32)
        if layer.clip is not None:
            attrs["clip"] = np.float32(layer.clip)
    validate.check_layer(where, attrs, arrays["indices"], arrays["indptr"], arrays["values"],
                         arrays["bias"])
    return attrs, arrays


class StoreWriter:
    """Builds a store under a temporary name, one layer at a time; ``close()`` renames it
    into place. As a context manager, an exception removes the temporary."""

    @held_signals
    def __init__(self, path: str | os.PathLike, provenance: dict | None = None,
                 readout: str = "alive"):
        if readout not in READOUTS:
            raise StoreError(f"readout {readout!r}; choose from {', '.join(READOUTS)}")
        self.path = Path(path)
        self._ctx = atomic_path(self.path, stream=False)  # HDF5 seeks and reads back
        self._tmp = self._ctx.__enter__()
        try:
            self._raw = _GuardedFile(self._tmp)
            self._file = h5py.File(self._raw, "w")
        except OSError as exc:
            self._ctx.__exit__(type(exc), exc, None)  # removes the temporary; raises SpdnnError
            raise  # pragma: no cover - the line above always raises
        self._file.attrs["format"] = FORMAT_NAME
        self._file.attrs["schema_version"] = SCHEMA_VERSION
        self._file.attrs["created"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self._file.attrs["provenance"] = json.dumps(provenance or {}, sort_keys=True)
        self._net = self._file.create_group("network")
        self._net.attrs["readout"] = readout
        self._packed = PackedWriter(self._net)
        self._file.create_group("truth")
        self._n_layers = 0
        self._last_n_out: int | None = None
        self._n_rows: int | None = None
        self._n_cols: int | None = None
        self._first_n_in: int | None = None
        self._n_outs: list[int] = []  # n_out of every layer written, for the class checks
        self._closed = False

    # -- content -----------------------------------------------------------
    @held_signals
    def set_provenance(self, provenance: dict) -> None:
        self._file.attrs["provenance"] = json.dumps(provenance, sort_keys=True)
        self._check_written()

    @held_signals
    def add_layer(self, layer: Layer) -> None:
        """Append the next layer (its n_in must equal the previous n_out), checked by the
        reader's rules on exactly what is stored (float32 casts done)."""
        if self._last_n_out is not None and layer.n_in != self._last_n_out:
            raise StoreError(
                f"layer {self._n_layers + 1} has {layer.n_in} inputs but the previous "
                f"layer has {self._last_n_out} outputs"
            )
        key = layer_key(self._n_layers)
        attrs, arrays = _stored_form(f"{self.path}: network/{key}", layer)
        if self._first_n_in is None:
            self._first_n_in = layer.n_in
            self._check_widths()
        if self._packed.append(attrs, arrays):
            self._raw.start_writeback()
        self._n_layers += 1
        self._last_n_out = layer.n_out
        self._n_outs.append(layer.n_out)
        self._check_written()

    @held_signals
    def write_inputs(self, rows: SparseRows) -> None:
        """Store the input feature rows (values omitted when binary), checked by the
        reader's rules first."""
        where = f"{self.path}: inputs"
        indices = np.asarray(rows.indices)
        validate.check_indices(where, "indices", indices, rows.n_cols, exact=False)
        indices = indices.astype(index_dtype(rows.n_cols), copy=False)
        indptr = np.asarray(rows.indptr - rows.indptr[0], dtype=np.int64)
        validate.check_row_pointer(where, "indptr", indptr, rows.n_rows, len(indices))
        values = None
        if rows.values is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                values = np.asarray(rows.values, dtype=np.float32)
            validate.check_vector(where, "values", values, np.float32, len(indices))
            validate.check_finite(where, "values", values)
        self._n_cols = validate.integer_attr(where, {"n_cols": rows.n_cols}, "n_cols", 1)
        self._check_widths()
        g = self._file.require_group("inputs")
        g.attrs["n_rows"] = rows.n_rows
        g.attrs["n_cols"] = rows.n_cols
        g.attrs["binary"] = values is None
        g.create_dataset("indptr", data=indptr)
        g.create_dataset("indices", data=indices)
        if values is not None:
            g.create_dataset("values", data=values)
        self._n_rows = rows.n_rows
        self._check_written()

    def _check_widths(self) -> None:
        """The inputs' width is layer 1's, whichever of the two was written first."""
        if self._n_cols is not None and self._first_n_in is not None \
                and self._n_cols != self._first_n_in:
            raise StoreError(f"{self.path}: inputs: n_cols {self._n_cols} but layer 1 has "
                             f"{self._first_n_in} inputs")

    def _per_image(self, what: str, data: np.ndarray, key: str, n_layers: int) -> np.ndarray:
        """``data`` as int64 classes, checked by the reader's rules: one per image, each
        below the outputs of layer ``n_layers``."""
        where = f"{self.path}: {key}"
        data = np.asarray(data)
        if self._n_rows is None:
            raise StoreError(f"{where}: write the inputs before the {what}")
        if not 1 <= n_layers <= self._n_layers:
            raise StoreError(f"{where}: for {n_layers} layers, the store has {self._n_layers}")
        whose = "the network" if n_layers == self._n_layers else f"layer {n_layers}"
        validate.check_classes(where, what, data, self._n_rows, self._n_outs[n_layers - 1],
                               whose)
        return data.astype(np.int64)

    @held_signals
    def write_labels(self, labels: np.ndarray) -> None:
        """Store the true class (0-based) of every input image (after the last layer)."""
        self._file.create_dataset("labels", data=self._per_image("labels", labels, "labels",
                                                                 self._n_layers))
        self._check_written()

    @held_signals
    def add_predictions(self, n_layers: int, classes: np.ndarray, computed_by: str) -> None:
        """Store the predicted class of every image after ``n_layers`` layers (argmax readout)."""
        key = f"l{n_layers}"
        data = self._per_image("predictions", classes, f"predictions/{key}", n_layers)
        d = self._file.require_group("predictions").create_dataset(key, data=data)
        d.attrs["n_layers"] = n_layers
        d.attrs["computed_by"] = computed_by
        self._check_written()

    @held_signals
    def add_truth(self, n_layers: int, categories: np.ndarray, computed_by: str) -> None:
        """Store the sorted 1-based ids of the images alive after ``n_layers`` layers."""
        ids = np.asarray(categories, dtype=np.int64)
        where = f"{self.path}: truth/l{n_layers}"
        if f"l{n_layers}" in self._file["truth"]:
            raise StoreError(f"{where}: stored twice (truth for {n_layers} layers given twice)")
        validate.check_truth(where, ids, self._n_rows)
        d = self._file["truth"].create_dataset(f"l{n_layers}", data=ids)
        d.attrs["n_layers"] = n_layers
        d.attrs["computed_by"] = computed_by
        self._check_written()

    # -- lifetime ----------------------------------------------------------
    def _check_written(self) -> None:
        """Stop (dropping the temporary) once a write to disk has failed."""
        if self._raw.error is not None:
            exc = self._raw.error
            self.abort()
            raise write_error(self.path, exc)

    @held_signals
    def close(self) -> None:
        """Finish the file and rename it to its final name."""
        if self._n_layers == 0:
            self.abort()
            raise StoreError(f"{self.path}: refusing to write a store with no layers")
        self._check_written()
        try:
            self._packed.flush()  # the layers' arrays still held
            self._net.attrs["n_layers"] = self._n_layers
            self._file.close()  # flushes the metadata: a full disk may show only here
        except OSError as exc:
            self.abort()
            raise write_error(self.path, exc) from None
        self._check_written()
        self._raw.close()
        self._closed = True
        self._ctx.__exit__(None, None, None)

    @held_signals
    def abort(self) -> None:
        """Drop the temporary file; the final name is left untouched (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._file.close()
        except (OSError, RuntimeError):
            pass  # the temporary is dropped anyway
        finally:
            self._raw.close()
            try:
                self._ctx.__exit__(StoreError, StoreError("aborted"), None)
            except StoreError:
                pass

    def __enter__(self) -> StoreWriter:
        return self

    @held_signals
    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
            if isinstance(exc, OSError) and exc.filename is None:  # a failed write (disk full)
                raise write_error(self.path, exc) from None
