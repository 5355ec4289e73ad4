"""Reading the HDF5 store (``docs/store.md``): one file holding a network, its inputs
and truth. Versioned and checked on open; every array is validated
(``formats.store.validate``) as it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from pathlib import Path

import h5py
import numpy as np

from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store import validate
from spdnn_mpi.formats.store.layers import GroupLayers, PackedLayers
from spdnn_mpi.formats.store.schema import (  # noqa: F401 - re-exported for users of this module
    FORMAT_NAME,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    layer_key,
)
from spdnn_mpi.formats.store.writer import StoreWriter  # noqa: F401 - re-exported
from spdnn_mpi.model import READOUTS, Layer, Network, SparseRows


class Store:
    """Read access to a store, checked against the schema on open and as arrays are read
    (no kernel sees an index out of range); ``validate_seconds`` sums the checks' time.
    Inputs are read by row range, so each rank touches only its own rows.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.validate_seconds = 0.0
        self._inputs_meta: tuple[int, int, int] | None = None
        validate.check_store_file(self.path)
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as exc:
            raise StoreError(f"{self.path}: not a readable HDF5 file ({exc})") from None
        try:
            self._check_header()
        except BaseException:
            self.close()
            raise

    def _check_header(self) -> None:
        attrs = self._file.attrs
        if attrs.get("format") != FORMAT_NAME:
            raise StoreError(f"{self.path}: not an spdnn_mpi store (format attribute missing)")
        version = attrs.get("schema_version")
        if not validate.is_integer(version) or int(version) not in SUPPORTED_SCHEMA_VERSIONS:
            supported = ", ".join(str(v) for v in sorted(SUPPORTED_SCHEMA_VERSIONS))
            raise StoreError(
                f"{self.path}: store schema version {validate.shown(version)}, this "
                f"spdnn_mpi reads version {supported}; re-create it with this version's "
                "`spdnn prepare`"
            )
        self.schema_version = int(version)
        net = self._file.get("network")
        if not isinstance(net, h5py.Group):
            raise StoreError(f"{self.path}: store has no network (group network missing)")
        self.n_layers = validate.integer_attr(f"{self.path}: network", net.attrs, "n_layers", 1)
        if self.schema_version >= 2 and "readout" not in net.attrs:
            raise StoreError(f"{self.path}: network: attribute readout missing (schema 2 "
                             "stores name their readout)")
        self.readout = str(net.attrs.get("readout", "alive"))  # schema 1: the challenge's
        if self.readout not in READOUTS:
            raise StoreError(f"{self.path}: network readout {self.readout!r} is not one of "
                             f"{', '.join(READOUTS)}")
        try:
            self.provenance = json.loads(attrs.get("provenance", "{}"))
        except (TypeError, ValueError):
            self.provenance = None
        if not isinstance(self.provenance, dict):
            raise StoreError(f"{self.path}: attribute provenance is not a JSON object")
        self.created = str(attrs.get("created", ""))
        if self.schema_version >= 3:
            self._layers = PackedLayers(str(self.path), net, self._read)
            if len(self._layers) != self.n_layers:
                raise StoreError(f"{self.path}: network/layers has {len(self._layers)} rows, "
                                 f"attribute n_layers says {self.n_layers}")
        else:
            self._layers = GroupLayers(str(self.path), net, self.n_layers, self._read)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def identity(self) -> str:
        """Digest of what makes this store itself (header, shapes, size), not of its path:
        copies of one store on several nodes agree."""
        facts = [self.schema_version, self.created, json.dumps(self.provenance, sort_keys=True),
                 self.n_layers, self._input_shape() if self.has_inputs else None,
                 self.path.stat().st_size]
        return hashlib.sha256(repr(facts).encode()).hexdigest()[:16]

    def describe_identity(self) -> str:
        """The facts behind ``identity()`` in words, for a message."""
        images = f"{self.n_images} images, " if self.has_inputs else ""
        return (f"{self.n_layers} layers, {images}{self.path.stat().st_size} bytes, "
                f"created {self.created or 'unknown'}")

    # -- reading datasets ----------------------------------------------------
    def _dataset(self, group: h5py.Group, key: str) -> h5py.Dataset:
        obj = group.get(key)
        if not isinstance(obj, h5py.Dataset):
            raise StoreError(f"{self.path}: {group.name[1:]}/{key}: dataset missing")
        return obj

    def _read(self, group: h5py.Group, key: str, sel=()) -> np.ndarray:
        """Dataset ``key`` of ``group`` (or a selection) as an array; damage is a StoreError."""
        ds = self._dataset(group, key)
        try:
            return np.asarray(ds[sel])
        except (OSError, ValueError, TypeError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StoreError(
                f"{self.path}: {ds.name[1:]}: cannot be read ({reason}); the file is damaged"
            ) from None

    def _timed(self, t0: float) -> None:
        self.validate_seconds += time.perf_counter() - t0

    # -- network -----------------------------------------------------------
    def _attrs(self, k: int) -> dict:
        """Layer ``k``'s attributes (a packed store's table row, named the same way)."""
        if not 0 <= k < self.n_layers:
            raise StoreError(f"{self.path}: layer {k + 1} asked for, store has {self.n_layers}")
        return self._layers.attrs(k)

    def _checked(self, k: int, attrs: dict, arrays) -> Layer:
        t0 = time.perf_counter()
        layer = validate.check_layer(f"{self.path}: network/{layer_key(k)}", attrs, *arrays)
        self._timed(t0)
        return layer

    def layer(self, k: int) -> Layer:
        """0-based layer ``k``, validated (shapes, row pointer, index range, finite values)."""
        return self._checked(k, self._attrs(k), self._layers.arrays(k))

    def layer_shapes(self) -> list[tuple[int, int, int]]:
        """(n_in, n_out, nnz) of every layer, read from attributes only."""
        out = []
        for k in range(self.n_layers):
            where = f"{self.path}: network/{layer_key(k)}"
            a = self._attrs(k)
            out.append(tuple(validate.integer_attr(where, a, name, low)
                             for name, low in (("n_in", 1), ("n_out", 1), ("nnz", 0))))
        return out

    def network(self, n_layers: int | None = None) -> Network:
        """The first ``n_layers`` layers (all by default), chained and checked; a
        packed store reads each of its few datasets once."""
        parts = self._layers.prefix(self._check_layer_count(n_layers))
        layers = [self._checked(k, attrs, arrays) for k, (attrs, arrays) in enumerate(parts)]
        for k in range(1, len(layers)):
            if layers[k].n_in != layers[k - 1].n_out:
                raise StoreError(
                    f"{self.path}: layer {k + 1} has {layers[k].n_in} inputs, "
                    f"layer {k} has {layers[k - 1].n_out} outputs"
                )
        return Network(layers, self.provenance, self.readout)

    def _check_layer_count(self, n_layers: int | None) -> int:
        if n_layers is None:
            return self.n_layers
        if not 1 <= n_layers <= self.n_layers:
            raise StoreError(f"{self.path}: {n_layers} layers asked for, store has {self.n_layers}")
        return n_layers

    # -- inputs ------------------------------------------------------------
    def _inputs_group(self) -> h5py.Group:
        group = self._file.get("inputs")
        if not isinstance(group, h5py.Group):
            raise StoreError(self._no_inputs_message())
        return group

    def is_imported_model(self) -> bool:
        """Whether ``spdnn import`` made this store (the argmax readout, or its provenance)."""
        return self.readout == "argmax" or self.provenance.get("tool") == "spdnn import"

    def _no_inputs_message(self) -> str:
        """No inputs, and how to make the store again with them."""
        if self.is_imported_model():
            source = self.provenance.get("source")
            model = source.get("model") if isinstance(source, dict) else None
            return (f"{self.path}: store has no inputs (the model was imported without "
                    f"--inputs); import it again with them: spdnn import "
                    f"{shlex.quote(str(model or 'MODEL'))} --out {shlex.quote(str(self.path))} "
                    "--force --inputs X.npy [--labels y.npy]")
        return (f"{self.path}: store has no inputs (it was prepared from the weights alone); "
                "build it again with inputs: spdnn prepare --weights DIR "
                "--inputs sparse-images-N.tsv (the official images) or --generate-inputs "
                "(MNIST-derived ones), or use spdnn generate")

    @property
    def has_inputs(self) -> bool:
        return "inputs" in self._file

    def _input_shape(self) -> tuple[int, int, int]:
        """(n_rows, n_cols, nnz) of the inputs, checked against the datasets (once)."""
        if self._inputs_meta is not None:
            return self._inputs_meta
        g = self._inputs_group()
        t0 = time.perf_counter()
        first_n_in = validate.integer_attr(f"{self.path}: network/{layer_key(0)}",
                                           self._attrs(0), "n_in", 1)
        n_rows, n_cols, nnz = validate.check_inputs_group(f"{self.path}: inputs", g, first_n_in)
        ends = (int(self._read(g, "indptr", 0)), int(self._read(g, "indptr", n_rows)))
        if ends != (0, nnz):
            raise StoreError(f"{self.path}: inputs/indptr: runs from {ends[0]} to {ends[1]}, "
                             f"expected 0 to {nnz} (the length of inputs/indices)")
        self._timed(t0)
        self._inputs_meta = (n_rows, n_cols, nnz)
        return self._inputs_meta

    @property
    def n_images(self) -> int:
        return self._input_shape()[0]

    @property
    def input_width(self) -> int:
        return self._input_shape()[1]

    def input_row_nnz(self) -> np.ndarray:
        """Nonzeros per input row (reads only the row pointer)."""
        n_rows, _, nnz = self._input_shape()
        indptr = self._read(self._inputs_group(), "indptr")
        t0 = time.perf_counter()
        validate.check_row_pointer(f"{self.path}: inputs", "indptr", indptr, n_rows, nnz)
        self._timed(t0)
        return np.diff(indptr)

    def inputs(self, start: int = 0, stop: int | None = None) -> SparseRows:
        """Input rows ``[start, stop)``, validated; reads only those rows from disk."""
        n_rows, n_cols, nnz = self._input_shape()
        g = self._inputs_group()
        where = f"{self.path}: inputs"
        stop = n_rows if stop is None else stop
        if not 0 <= start <= stop <= n_rows:
            raise StoreError(f"{self.path}: input rows [{start}, {stop}) outside [0, {n_rows})")
        indptr = self._read(g, "indptr", slice(start, stop + 1))
        t0 = time.perf_counter()
        validate.check_row_pointer_slice(where, "indptr", indptr, nnz)
        self._timed(t0)
        lo, hi = int(indptr[0]), int(indptr[-1])
        indices = self._read(g, "indices", slice(lo, hi))
        values = self._read(g, "values", slice(lo, hi)) if "values" in g else None
        t0 = time.perf_counter()
        validate.check_indices(where, "indices", indices, n_cols)
        if values is not None:
            validate.check_finite(where, "values", values)
        self._timed(t0)
        return SparseRows(n_cols, indptr - lo, indices, values, start)

    # -- truth and predictions: one dataset l<n_layers> a layer count ------------
    def _stored(self, name: str, n_layers: int) -> tuple[h5py.Group, str] | None:
        """(group, key) of group ``name``'s set for ``n_layers`` layers, if stored."""
        group, key = self._file.get(name), f"l{n_layers}"
        return (group, key) if isinstance(group, h5py.Group) and key in group else None

    def _stored_layers(self, name: str) -> list[int]:
        """The layer counts group ``name`` has a set for."""
        group = self._file.get(name)
        if not isinstance(group, h5py.Group):
            return []
        return sorted(
            validate.integer_attr(f"{self.path}: {d.name[1:]}", d.attrs, "n_layers", 1)
            for d in group.values()
        )

    def _source(self, name: str, n_layers: int) -> str | None:
        """What computed group ``name``'s set for ``n_layers`` layers, if stored."""
        found = self._stored(name, n_layers)
        if found is None:
            return None
        group, key = found
        return str(group[key].attrs.get("computed_by", "unknown"))

    def truth_layers(self) -> list[int]:
        return self._stored_layers("truth")

    def truth(self, n_layers: int) -> np.ndarray | None:
        """Sorted 1-based surviving image ids after ``n_layers`` layers, if stored (validated)."""
        found = self._stored("truth", n_layers)
        if found is None:
            return None
        group, key = found
        ids = self._read(group, key)
        n_images = self.n_images if self.has_inputs else None
        t0 = time.perf_counter()
        validate.check_truth(f"{self.path}: truth/{key}", ids, n_images)
        self._timed(t0)
        return ids

    def truth_source(self, n_layers: int) -> str | None:
        return self._source("truth", n_layers)

    # -- labels and predictions (argmax readout) ----------------------------
    def _classes(self, group: h5py.Group, key: str, what: str, n_layers: int) -> np.ndarray:
        """A per-image class vector, validated: integers, one per image, each below the
        outputs of layer ``n_layers``."""
        where = f"{self.path}: {group.name[1:] + '/' if group.name != '/' else ''}{key}"
        if not 1 <= n_layers <= self.n_layers:
            raise StoreError(f"{where}: for {n_layers} layers, the store has {self.n_layers}")
        n_classes = validate.integer_attr(f"{self.path}: network/{layer_key(n_layers - 1)}",
                                          self._attrs(n_layers - 1), "n_out", 1)
        classes = self._read(group, key)
        whose = "the network" if n_layers == self.n_layers else f"layer {n_layers}"
        validate.check_classes(where, what, classes, self.n_images if self.has_inputs else None,
                               n_classes, whose)
        return classes.astype(np.int64)

    @property
    def has_labels(self) -> bool:
        return isinstance(self._file.get("labels"), h5py.Dataset)

    def labels(self) -> np.ndarray | None:
        """True 0-based class of every image, if stored."""
        if not self.has_labels:
            return None
        return self._classes(self._file, "labels", "labels", self.n_layers)

    def prediction_layers(self) -> list[int]:
        return self._stored_layers("predictions")

    def predictions(self, n_layers: int) -> np.ndarray | None:
        """Stored predicted class of every image after ``n_layers`` layers, if any."""
        found = self._stored("predictions", n_layers)
        return None if found is None else self._classes(*found, "predictions", n_layers)

    def predictions_source(self, n_layers: int) -> str | None:
        return self._source("predictions", n_layers)

    def _activation_counts(self) -> dict[str, int]:
        """How many layers have each activation (read from attributes only)."""
        counts: dict[str, int] = {}
        for k in range(self.n_layers):
            name = str(self._attrs(k).get("activation", "relu"))
            counts[name] = counts.get(name, 0) + 1
        return counts

    def summary(self) -> dict:
        """What ``spdnn info`` prints: shapes, sizes, truth and provenance."""
        shapes = self.layer_shapes()
        info = {
            "path": str(self.path),
            "schema_version": self.schema_version,
            "readout": self.readout,
            "created": self.created,
            "file_bytes": self.path.stat().st_size,
            "n_layers": self.n_layers,
            "neurons_in": shapes[0][0] if shapes else None,
            "neurons_out": shapes[-1][1] if shapes else None,
            "edges": int(sum(s[2] for s in shapes)),
            "truth_layers": self.truth_layers(),
            "prediction_layers": self.prediction_layers(),
            "activations": self._activation_counts(),
            "provenance": self.provenance,
        }
        if self.has_inputs:
            g = self._inputs_group()
            info["images"], _, info["input_nnz"] = self._input_shape()
            info["inputs_binary"] = "values" not in g
        if self.has_labels:
            info["labels"] = int(self._file["labels"].shape[0])
        return info
