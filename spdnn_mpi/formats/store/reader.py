"""Reading the HDF5 store (``docs/store.md``): one file holding a network, its inputs
and truth. Versioned and checked on open; every array is validated
(``formats.store.validate``) as it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store import validate
from spdnn_mpi.formats.store.answers import StoredAnswers
from spdnn_mpi.formats.store.inputs import StoredInputs
from spdnn_mpi.formats.store.layers import GroupLayers, PackedLayers
from spdnn_mpi.formats.store.schema import (  # noqa: F401 - re-exported for users of this module
    FORMAT_NAME,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    layer_key,
)
from spdnn_mpi.formats.store.writer import StoreWriter  # noqa: F401 - re-exported
from spdnn_mpi.model import READOUTS, Layer, Network

#: Mean entries a layer from which the layers are validated on several threads: two
#: threads took 0.050 s against 0.063 s for 480 layers of 16384 x 32 entries and
#: 0.078 against 0.124 s for 240 layers of 65536 x 32, but 0.159 against 0.061 s for
#: 1920 layers of 4096 x 32, where each check is mostly Python (2-core VM, 2026-12-05).
PARALLEL_CHECK_NNZ = 1 << 19


class Store(StoredInputs, StoredAnswers):
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

    def _check(self, k: int, attrs: dict, arrays, in_range: bool = False) -> Layer:
        """Layer ``k`` built from its attributes and arrays, every rule checked
        (``in_range``: its ids were already found in range)."""
        return validate.check_layer(f"{self.path}: network/{layer_key(k)}", attrs, *arrays,
                                    indices_in_range=in_range)

    def _checked(self, k: int, attrs: dict, arrays) -> Layer:
        t0 = time.perf_counter()
        layer = self._check(k, attrs, arrays)
        self._timed(t0)
        return layer

    def _checked_all(self, parts: list) -> list[Layer]:
        """Every layer of ``parts`` validated: the ids of layers lying back to back in
        one reduction a run, over every core the process may use
        (``validate.indices_in_range``); a packed table's attributes in one pass
        (``validate.simple_rows``); layers of PARALLEL_CHECK_NNZ entries or more on
        those cores too (the checks are numpy reductions, which release the GIL).
        The first damaged layer in order is the one refused."""
        from spdnn_mpi.util.workers import default_jobs

        t0 = time.perf_counter()
        threads = min(default_jobs(), len(parts))
        in_range = validate.indices_in_range([attrs.get("n_in") for attrs, _ in parts],
                                             [arrays[0] for _, arrays in parts], threads)
        nnz = sum(len(arrays[0]) for _attrs, arrays in parts)
        if threads < 2 or nnz < PARALLEL_CHECK_NNZ * len(parts):
            simple, indptrs, layers = self._layers.simple(len(parts)), {}, []
            for k, ((attrs, arrays), ok, is_simple) in enumerate(zip(parts, in_range, simple)):
                layer = validate.simple_layer(attrs, arrays[0], ok, indptrs) if is_simple else None
                layers.append(layer or self._check(k, attrs, arrays, ok))
        else:
            with ThreadPoolExecutor(threads) as pool:
                layers = list(pool.map(self._check, range(len(parts)),
                                       [attrs for attrs, _ in parts],
                                       [arrays for _, arrays in parts], in_range))
        self._timed(t0)
        return layers

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
        layers = self._checked_all(parts)
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
