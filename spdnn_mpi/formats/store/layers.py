"""How a store keeps its layers: packed (schema 3) or one HDF5 group a layer (1 and 2).

Schema 3 packs every layer's arrays into a few datasets with a table of offsets
(``docs/store.md``): a few large reads, where one group a layer cost about 1 ms a
layer in HDF5 calls. Both forms give the reader a layer's attributes (schema 2's
names) and arrays.
"""

from __future__ import annotations

from collections.abc import Callable

import h5py
import numpy as np

from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store.schema import layer_key
from spdnn_mpi.formats.store.validate import simple_rows
from spdnn_mpi.model import ACTIVATIONS

#: One row per layer (schema 3): shape, forms and where its arrays start (-1: no such
#: array). Unused value fields hold NaN, so a start damaged into -1 is refused.
TABLE_DTYPE = np.dtype([
    ("n_in", "<i8"), ("n_out", "<i8"), ("nnz", "<i8"), ("row_degree", "<i8"),
    ("indices_start", "<i8"), ("indptr_start", "<i8"), ("values_start", "<i8"),
    ("bias_start", "<i8"), ("uniform_value", "<f4"), ("bias", "<f4"), ("clip", "<f4"),
    ("has_clip", "u1"), ("activation", "u1"),
])
#: Packed dataset -> its dtype (indices of layers with at most 65536 inputs are 16-bit).
DATASETS = {"indices16": np.uint16, "indices32": np.int32, "indptr": np.int64,
            "values": np.float32, "bias": np.float32}
#: Entries a chunk of the packed datasets holds, at least and at most (about a layer's
#: worth for small networks, so their file stays their size).
CHUNK_RANGE = (1 << 12, 1 << 21)

Arrays = tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]


def index_dataset(n_in: int) -> str:
    """The dataset that holds the indices of a layer with ``n_in`` inputs."""
    return "indices16" if n_in <= 65536 else "indices32"


def spans(row) -> dict[str, tuple[int, int]]:
    """The dataset ranges [start, stop) of one table row's arrays (present ones only)."""
    out = {index_dataset(int(row["n_in"])): (int(row["indices_start"]), int(row["nnz"]))}
    for name, start, size in (("indptr", row["indptr_start"], row["n_out"] + 1),
                              ("values", row["values_start"], row["nnz"]),
                              ("bias", row["bias_start"], row["n_out"])):
        if start != -1:
            out[name] = (int(start), int(size))
    return {name: (start, start + size) for name, (start, size) in out.items()}


def row_attrs(row) -> dict:
    """A table row as the attributes a layer group would have (schema 2's names)."""
    attrs = {"n_in": row["n_in"], "n_out": row["n_out"], "nnz": row["nnz"]}
    if row["row_degree"] >= 0:
        attrs["row_degree"] = row["row_degree"]
    if row["values_start"] < 0:
        attrs["uniform_value"] = row["uniform_value"]
    if row["bias_start"] < 0:
        attrs["bias"] = row["bias"]
    if row["has_clip"]:
        attrs["clip"] = row["clip"]
    if row["activation"] < len(ACTIVATIONS):
        attrs["activation"] = ACTIVATIONS[int(row["activation"])]
    else:
        attrs["activation"] = f"code {int(row['activation'])}"
    return attrs


class PackedWriter:
    """Appends layers to the packed datasets of a ``/network`` group being written,
    in writes of about FLUSH_BYTES (``flush`` writes what is held: call it before the
    file closes). HDF5 calls cost about 0.3 ms each whatever their size: two resizes
    and writes a layer were 1.5 ms of every layer's 2 ms in ``spdnn prepare``."""

    #: bytes of arrays held before they are written: what is left at the end is written
    #: after the last layer, in no one's shadow (32 MB: `spdnn prepare` closed a 139 MB
    #: store 0.070-0.079 s after its last layer, against 0.041-0.047 s with 8 MB)
    FLUSH_BYTES = 8 << 20

    def __init__(self, network: h5py.Group) -> None:
        self._group = network
        self._table = network.create_dataset("layers", shape=(0,), maxshape=(None,),
                                             dtype=TABLE_DTYPE, chunks=(1024,))
        self._sizes = dict.fromkeys(DATASETS, 0)
        self._made: set[str] = set()  # datasets created (an HDF5 lookup costs 40 us)
        self._held: dict[str, list[np.ndarray]] = {name: [] for name in DATASETS}
        self._held_bytes = 0
        self._rows: list = []

    def _append(self, name: str, data: np.ndarray) -> int:
        """Hold ``data`` for dataset ``name`` (made on first use); its start."""
        start = self._sizes[name]
        if name not in self._made:
            low, high = CHUNK_RANGE
            chunk = min(high, max(low, 1 << max(0, len(data) - 1).bit_length()))
            self._group.create_dataset(name, shape=(0,), maxshape=(None,),
                                       dtype=DATASETS[name], chunks=(chunk,))
            self._made.add(name)
        if len(data):
            data = np.ascontiguousarray(data, dtype=DATASETS[name])
            self._held[name].append(data)
            self._held_bytes += data.nbytes
        self._sizes[name] = start + len(data)
        return start

    def append(self, attrs: dict, arrays: dict) -> bool:
        """One layer in the stored form (``attrs`` and ``arrays`` as schema 2 names them:
        a None array is kept in its attribute form); True when it wrote what was held."""
        row = np.zeros(1, dtype=TABLE_DTYPE)[0]
        for name in ("n_in", "n_out", "nnz"):
            row[name] = attrs[name]
        row["row_degree"] = attrs.get("row_degree", -1)
        row["indices_start"] = self._append(index_dataset(attrs["n_in"]), arrays["indices"])
        for name in ("indptr", "values", "bias"):
            data = arrays[name]
            row[f"{name}_start"] = -1 if data is None else self._append(name, data)
        row["uniform_value"] = attrs.get("uniform_value", np.nan)
        row["bias"] = attrs.get("bias", np.nan)
        row["has_clip"] = "clip" in attrs
        row["clip"] = attrs.get("clip", 0.0)
        row["activation"] = ACTIVATIONS.index(attrs["activation"])
        self._rows.append(row)
        if self._held_bytes >= self.FLUSH_BYTES:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """Write the arrays and table rows held (one resize and write a dataset)."""
        for name, parts in self._held.items():
            if parts:
                ds = self._group[name]
                written = ds.shape[0]
                ds.resize((self._sizes[name],))
                ds[written:] = parts[0] if len(parts) == 1 else np.concatenate(parts)
                parts.clear()
        self._held_bytes = 0
        if self._rows:
            n = len(self._table)
            self._table.resize((n + len(self._rows),))
            self._table[n:] = np.array(self._rows, dtype=TABLE_DTYPE)
            self._rows.clear()


class PackedLayers:
    """The layers of a schema 3 store: the table, and arrays read by range."""

    def __init__(self, path: str, network: h5py.Group,
                 read: Callable[[h5py.Group, str, object], np.ndarray]) -> None:
        self._path = path
        self._group = network
        self._read = read  # (group, key, selection) -> array; damage is a StoreError
        table = read(network, "layers", ())
        if table.dtype != TABLE_DTYPE or table.ndim != 1:
            raise StoreError(f"{path}: network/layers: dtype {table.dtype} of shape "
                             f"{table.shape}, not the schema's layer table")
        self._table = table
        # rows as dicts of Python scalars: a field of a NumPy record costs ten times more
        self._rows = [dict(zip(TABLE_DTYPE.names, row)) for row in table.tolist()]
        self._lengths = {name: (network[name].shape[0] if isinstance(
            network.get(name), h5py.Dataset) else 0) for name in DATASETS}

    def __len__(self) -> int:
        return len(self._rows)

    def attrs(self, k: int) -> dict:
        return row_attrs(self._rows[k])

    def simple(self, n_layers: int) -> list[bool]:
        """Which of the first ``n_layers`` layers are in the simple form with every
        attribute rule holding (``validate.simple_rows``)."""
        return simple_rows(self._table[:n_layers]).tolist()

    def _spans(self, k: int) -> dict[str, tuple[int, int]]:
        """Where layer ``k``'s arrays lie, every range inside its dataset."""
        out = spans(self._rows[k])
        for name, (start, stop) in out.items():
            if start < 0 or stop > self._lengths[name]:
                where = f"{self._path}: network/{layer_key(k)}"
                raise StoreError(f"{where}: its {name} entries [{start}, {stop}) lie outside "
                                 f"network/{name} ({self._lengths[name]} entries)")
        return out

    def arrays(self, k: int) -> Arrays:
        """Layer ``k``'s arrays, read by range."""
        return self._split(self._spans(k), {})

    def prefix(self, n_layers: int) -> list[tuple[dict, Arrays]]:
        """(attributes, arrays) of the first ``n_layers`` layers, from one read of each
        dataset's prefix (views into it)."""
        all_spans = [self._spans(k) for k in range(n_layers)]
        ends = {}
        for s in all_spans:
            for name, (_start, stop) in s.items():
                ends[name] = max(ends.get(name, 0), stop)
        data = {name: self._read_prefix(name, end) for name, end in ends.items()}
        return [(self.attrs(k), self._split(s, data)) for k, s in enumerate(all_spans)]

    def _read_prefix(self, name: str, stop: int) -> np.ndarray:
        """Dataset ``name``'s first ``stop`` entries: from the file's bytes on every
        core where its layout allows (``direct``), else through HDF5."""
        from spdnn_mpi.formats.store.direct import read_prefix
        from spdnn_mpi.util.workers import default_jobs

        try:
            data = read_prefix(self._group[name], stop, default_jobs())
        except OSError as exc:
            raise StoreError(f"{self._path}: network/{name}: cannot be read ({exc}); "
                             "the file is damaged") from None
        return data if data is not None else self._read(self._group, name, slice(0, stop))

    def _split(self, spans_k: dict[str, tuple[int, int]], data: dict) -> Arrays:
        def take(name: str) -> np.ndarray | None:
            if name not in spans_k:
                return None
            start, stop = spans_k[name]
            if name in data:
                return data[name][start:stop]
            return self._read(self._group, name, slice(start, stop))

        indices = take("indices16")
        return (take("indices32") if indices is None else indices, take("indptr"),
                take("values"), take("bias"))


class GroupLayers:
    """The layers of a schema 1 or 2 store: one group a layer."""

    def __init__(self, path: str, network: h5py.Group, n_layers: int,
                 read: Callable[[h5py.Group, str, object], np.ndarray]) -> None:
        self._path = path
        self._group = network
        self._n = n_layers
        self._read = read

    def __len__(self) -> int:
        return self._n

    def _layer_group(self, k: int) -> h5py.Group:
        group = self._group.get(layer_key(k))
        if not isinstance(group, h5py.Group):
            raise StoreError(f"{self._path}: layer group network/{layer_key(k)} missing")
        return group

    def attrs(self, k: int) -> dict:
        return dict(self._layer_group(k).attrs)  # one read of every attribute

    def arrays(self, k: int) -> Arrays:
        g = self._layer_group(k)
        members = set(g.keys())
        indptr = None if "row_degree" in g.attrs else self._read(g, "indptr", ())
        return (self._read(g, "indices", ()), indptr,
                self._read(g, "values", ()) if "values" in members else None,
                self._read(g, "bias", ()) if "bias" in members else None)

    def prefix(self, n_layers: int) -> list[tuple[dict, Arrays]]:
        return [(self.attrs(k), self.arrays(k)) for k in range(n_layers)]

    def simple(self, n_layers: int) -> list[bool]:
        """None: a group's attributes are checked layer by layer (``check_layer``)."""
        return [False] * n_layers
