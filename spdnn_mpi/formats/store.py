"""The HDF5 store: one file holding a network, its inputs and truth categories.

Every rank loads from this format, so it is versioned and checked on open.
The schema is documented in ``docs/store.md``; bump ``SCHEMA_VERSION`` on any
incompatible change.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from spdnn_mpi.atomic import atomic_path
from spdnn_mpi.errors import StoreError
from spdnn_mpi.model import Layer, Network, SparseRows, index_dtype

FORMAT_NAME = "spdnn_mpi.store"
SCHEMA_VERSION = 1


def layer_key(k: int) -> str:
    """Group name of 0-based layer ``k`` (``l00001`` is the first layer)."""
    return f"l{k + 1:05d}"


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class StoreWriter:
    """Builds a store under a temporary name; ``close()`` renames it into place.

    Use as a context manager: an exception inside the block removes the
    temporary, so no half-written store is ever left under the final name.
    Layers are written one at a time, so writing never holds a whole network.
    """

    def __init__(self, path: str | os.PathLike, provenance: dict | None = None):
        self.path = Path(path)
        self._ctx = atomic_path(self.path)
        self._tmp = self._ctx.__enter__()
        self._file = h5py.File(self._tmp, "w")
        self._file.attrs["format"] = FORMAT_NAME
        self._file.attrs["schema_version"] = SCHEMA_VERSION
        self._file.attrs["created"] = _now()
        self._file.attrs["provenance"] = json.dumps(provenance or {}, sort_keys=True)
        self._net = self._file.create_group("network")
        self._file.create_group("truth")
        self._n_layers = 0
        self._last_n_out: int | None = None

    # -- content -----------------------------------------------------------
    def set_provenance(self, provenance: dict) -> None:
        self._file.attrs["provenance"] = json.dumps(provenance, sort_keys=True)

    def add_layer(self, layer: Layer) -> None:
        """Append the next layer (its n_in must equal the previous n_out)."""
        if self._last_n_out is not None and layer.n_in != self._last_n_out:
            raise StoreError(
                f"layer {self._n_layers + 1} has {layer.n_in} inputs but the previous "
                f"layer has {self._last_n_out} outputs"
            )
        g = self._net.create_group(layer_key(self._n_layers))
        g.attrs["n_in"] = layer.n_in
        g.attrs["n_out"] = layer.n_out
        g.attrs["nnz"] = layer.nnz
        g.create_dataset("indices", data=np.asarray(layer.indices, dtype=index_dtype(layer.n_in)))
        degree = layer.row_degree
        if degree is not None:
            g.attrs["row_degree"] = degree
        else:
            g.create_dataset("indptr", data=np.asarray(layer.indptr, dtype=np.int64))
        if layer.values is None:
            g.attrs["uniform_value"] = np.float32(layer.uniform_value)
        else:
            g.create_dataset("values", data=np.asarray(layer.values, dtype=np.float32))
        if layer.bias_is_scalar:
            g.attrs["bias"] = np.float32(layer.bias)
        else:
            g.create_dataset("bias", data=np.asarray(layer.bias, dtype=np.float32))
        if layer.clip is not None:
            g.attrs["clip"] = np.float32(layer.clip)
        self._n_layers += 1
        self._last_n_out = layer.n_out
        self._net.attrs["n_layers"] = self._n_layers

    def write_inputs(self, rows: SparseRows) -> None:
        """Store the input feature rows (values omitted when binary)."""
        g = self._file.require_group("inputs")
        g.attrs["n_rows"] = rows.n_rows
        g.attrs["n_cols"] = rows.n_cols
        g.attrs["binary"] = rows.values is None
        g.create_dataset("indptr", data=np.asarray(rows.indptr - rows.indptr[0], dtype=np.int64))
        g.create_dataset("indices", data=np.asarray(rows.indices, dtype=index_dtype(rows.n_cols)))
        if rows.values is not None:
            g.create_dataset("values", data=np.asarray(rows.values, dtype=np.float32))

    def add_truth(self, n_layers: int, categories: np.ndarray, computed_by: str) -> None:
        """Store the sorted 1-based ids of the images alive after ``n_layers`` layers."""
        d = self._file["truth"].create_dataset(
            f"l{n_layers}", data=np.asarray(categories, dtype=np.int64)
        )
        d.attrs["n_layers"] = n_layers
        d.attrs["computed_by"] = computed_by

    # -- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Finish the file and rename it to its final name."""
        if self._n_layers == 0:
            self.abort()
            raise StoreError(f"{self.path}: refusing to write a store with no layers")
        self._file.close()
        self._ctx.__exit__(None, None, None)

    def abort(self) -> None:
        """Drop the temporary file; the final name is left untouched."""
        try:
            self._file.close()
        finally:
            try:
                self._ctx.__exit__(StoreError, StoreError("aborted"), None)
            except StoreError:
                pass

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class Store:
    """Read access to a store, checked against the schema on open.

    Inputs can be read by row range so that each MPI rank touches only its
    own rows.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise StoreError(f"{self.path}: no such store")
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as exc:
            raise StoreError(f"{self.path}: not a readable HDF5 file ({exc})") from None
        attrs = self._file.attrs
        if attrs.get("format") != FORMAT_NAME:
            self.close()
            raise StoreError(f"{self.path}: not an spdnn_mpi store (format attribute missing)")
        version = int(attrs.get("schema_version", -1))
        if version != SCHEMA_VERSION:
            self.close()
            raise StoreError(
                f"{self.path}: store schema version {version}, this spdnn_mpi reads "
                f"version {SCHEMA_VERSION}; re-create it with this version's `spdnn prepare`"
            )
        if "network" not in self._file or "n_layers" not in self._file["network"].attrs:
            self.close()
            raise StoreError(f"{self.path}: store has no network")
        self.n_layers = int(self._file["network"].attrs["n_layers"])
        self.provenance = json.loads(attrs.get("provenance", "{}"))
        self.created = str(attrs.get("created", ""))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- network -----------------------------------------------------------
    def _layer_group(self, k: int) -> h5py.Group:
        if not 0 <= k < self.n_layers:
            raise StoreError(f"{self.path}: layer {k + 1} asked for, store has {self.n_layers}")
        key = layer_key(k)
        if key not in self._file["network"]:
            raise StoreError(f"{self.path}: layer group network/{key} missing")
        return self._file["network"][key]

    def layer(self, k: int) -> Layer:
        """0-based layer ``k``, checked for consistent shapes and index range."""
        g = self._layer_group(k)
        where = f"{self.path}: network/{layer_key(k)}"
        n_in, n_out, nnz = (int(g.attrs[a]) for a in ("n_in", "n_out", "nnz"))
        indices = g["indices"][()]
        if len(indices) != nnz:
            raise StoreError(f"{where}: {len(indices)} indices, nnz attribute says {nnz}")
        if "row_degree" in g.attrs:
            degree = int(g.attrs["row_degree"])
            if degree * n_out != nnz:
                raise StoreError(f"{where}: row_degree {degree} x {n_out} rows != nnz {nnz}")
            indptr = np.arange(0, nnz + 1, max(degree, 1), dtype=np.int64)
            if degree == 0:
                indptr = np.zeros(n_out + 1, dtype=np.int64)
        else:
            indptr = g["indptr"][()]
            if len(indptr) != n_out + 1 or indptr[0] != 0 or indptr[-1] != nnz:
                raise StoreError(f"{where}: indptr inconsistent with n_out={n_out}, nnz={nnz}")
        if nnz and int(indices.max()) >= n_in:
            raise StoreError(f"{where}: input index {int(indices.max())} >= n_in {n_in}")
        values = g["values"][()] if "values" in g else None
        uniform = float(g.attrs["uniform_value"]) if "uniform_value" in g.attrs else None
        if values is not None and len(values) != nnz:
            raise StoreError(f"{where}: {len(values)} values for {nnz} nonzeros")
        bias = g["bias"][()] if "bias" in g else float(g.attrs.get("bias", 0.0))
        clip = float(g.attrs["clip"]) if "clip" in g.attrs else None
        try:
            return Layer(n_in, n_out, indptr, indices, values, uniform, bias, clip)
        except ValueError as exc:
            raise StoreError(f"{where}: {exc}") from None

    def layer_shapes(self) -> list[tuple[int, int, int]]:
        """(n_in, n_out, nnz) of every layer, read from attributes only."""
        out = []
        for k in range(self.n_layers):
            a = self._layer_group(k).attrs
            out.append((int(a["n_in"]), int(a["n_out"]), int(a["nnz"])))
        return out

    def iter_layers(self, n_layers: int | None = None) -> Iterator[Layer]:
        for k in range(self._check_layer_count(n_layers)):
            yield self.layer(k)

    def network(self, n_layers: int | None = None) -> Network:
        """The first ``n_layers`` layers (all by default), chained and checked."""
        layers = list(self.iter_layers(n_layers))
        for k in range(1, len(layers)):
            if layers[k].n_in != layers[k - 1].n_out:
                raise StoreError(
                    f"{self.path}: layer {k + 1} has {layers[k].n_in} inputs, "
                    f"layer {k} has {layers[k - 1].n_out} outputs"
                )
        return Network(layers, self.provenance)

    def _check_layer_count(self, n_layers: int | None) -> int:
        if n_layers is None:
            return self.n_layers
        if not 1 <= n_layers <= self.n_layers:
            raise StoreError(f"{self.path}: {n_layers} layers asked for, store has {self.n_layers}")
        return n_layers

    # -- inputs ------------------------------------------------------------
    def _inputs_group(self) -> h5py.Group:
        if "inputs" not in self._file:
            raise StoreError(f"{self.path}: store has no inputs")
        return self._file["inputs"]

    @property
    def has_inputs(self) -> bool:
        return "inputs" in self._file

    @property
    def n_images(self) -> int:
        return int(self._inputs_group().attrs["n_rows"])

    @property
    def input_width(self) -> int:
        return int(self._inputs_group().attrs["n_cols"])

    def input_row_nnz(self) -> np.ndarray:
        """Nonzeros per input row (reads only the row pointer)."""
        return np.diff(self._inputs_group()["indptr"][()])

    def inputs(self, start: int = 0, stop: int | None = None) -> SparseRows:
        """Input rows ``[start, stop)``; reads only those rows from disk."""
        g = self._inputs_group()
        n_rows = int(g.attrs["n_rows"])
        stop = n_rows if stop is None else stop
        if not 0 <= start <= stop <= n_rows:
            raise StoreError(f"{self.path}: input rows [{start}, {stop}) outside [0, {n_rows})")
        indptr = g["indptr"][start : stop + 1]
        lo, hi = int(indptr[0]), int(indptr[-1])
        indices = g["indices"][lo:hi]
        values = g["values"][lo:hi] if "values" in g else None
        return SparseRows(int(g.attrs["n_cols"]), indptr - lo, indices, values, start)

    # -- truth -------------------------------------------------------------
    def truth_layers(self) -> list[int]:
        return sorted(int(d.attrs["n_layers"]) for d in self._file["truth"].values())

    def truth(self, n_layers: int) -> np.ndarray | None:
        """Sorted 1-based surviving image ids after ``n_layers`` layers, if stored."""
        key = f"l{n_layers}"
        if key not in self._file["truth"]:
            return None
        return self._file["truth"][key][()]

    def truth_source(self, n_layers: int) -> str | None:
        key = f"l{n_layers}"
        if key not in self._file["truth"]:
            return None
        return str(self._file["truth"][key].attrs.get("computed_by", "unknown"))

    def summary(self) -> dict:
        """What ``spdnn info`` prints: shapes, sizes, truth and provenance."""
        shapes = self.layer_shapes()
        info = {
            "path": str(self.path),
            "schema_version": SCHEMA_VERSION,
            "created": self.created,
            "file_bytes": self.path.stat().st_size,
            "n_layers": self.n_layers,
            "neurons_in": shapes[0][0] if shapes else None,
            "neurons_out": shapes[-1][1] if shapes else None,
            "edges": int(sum(s[2] for s in shapes)),
            "truth_layers": self.truth_layers(),
            "provenance": self.provenance,
        }
        if self.has_inputs:
            g = self._inputs_group()
            info["images"] = int(g.attrs["n_rows"])
            info["input_nnz"] = int(g["indptr"][-1])
            info["inputs_binary"] = bool(g.attrs["binary"])
        return info
