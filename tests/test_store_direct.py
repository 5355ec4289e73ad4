"""Packed datasets read from the file's bytes (``formats.store.direct``): the same
arrays as HDF5 reads, HDF5 where the layout does not allow it, and a truncated
file refused."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import random_inputs, random_network

from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store import direct
from spdnn_mpi.formats.store.reader import Store
from spdnn_mpi.formats.store.writer import StoreWriter


def _dataset(path, data, **kw):
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=data, maxshape=(None,), **kw)
    return h5py.File(path, "r")


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.float32])
@pytest.mark.parametrize("threads", [1, 3])
def test_prefixes_equal_hdf5_reads(tmp_path, monkeypatch, dtype, threads):
    monkeypatch.setattr(direct, "READ_BYTES", 3000)  # many runs: the threads share them
    rng = np.random.default_rng(1)
    data = rng.integers(0, 60000, 10_007).astype(dtype)
    with _dataset(tmp_path / "a.h5", data, chunks=(512,)) as f:
        for stop in (1, 511, 512, 513, 4096, 10_006, 10_007):
            got = direct.read_prefix(f["d"], stop, threads)
            np.testing.assert_array_equal(got, data[:stop])
            assert got.dtype == data.dtype


def test_layouts_it_cannot_read_go_through_hdf5(tmp_path):
    data = np.arange(5000, dtype=np.int32)
    with _dataset(tmp_path / "z.h5", data, chunks=(512,), compression="gzip") as f:
        assert direct.read_prefix(f["d"], 5000, 2) is None  # filtered
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("d", data=data)  # contiguous, not chunked
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert direct.read_prefix(f["d"], 5000, 2) is None
    with h5py.File(tmp_path / "g.h5", "w") as f:
        ds = f.create_dataset("d", shape=(0,), maxshape=(None,), chunks=(512,), dtype=np.int32)
        ds.resize((5000,))
        ds[:1000] = data[:1000]  # the later chunks never written: the fill value
    with h5py.File(tmp_path / "g.h5", "r") as f:
        assert direct.read_prefix(f["d"], 5000, 2) is None
        np.testing.assert_array_equal(direct.read_prefix(f["d"], 1000, 2), data[:1000])
    with h5py.File(tmp_path / "u.h5", "w", userblock_size=512) as f:
        f.create_dataset("d", data=data, chunks=(512,), maxshape=(None,))
    with h5py.File(tmp_path / "u.h5", "r") as f:
        assert direct.read_prefix(f["d"], 5000, 2) is None


def _store(path, n_layers=6):
    rng = np.random.default_rng(2)
    net = random_network(rng, [300] * (n_layers + 1), 0.05, bias="vector")
    with StoreWriter(path) as w:
        for layer in net.layers:
            w.add_layer(layer)
        w.write_inputs(random_inputs(rng, 50, 300, 0.2))
    return net


def test_a_store_reads_the_same_network(tmp_path, monkeypatch):
    net = _store(tmp_path / "s.h5")
    calls = []
    read_prefix = direct.read_prefix
    monkeypatch.setattr(direct, "read_prefix",
                        lambda *a: calls.append(a[0].name) or read_prefix(*a))
    with Store(tmp_path / "s.h5") as store:
        got = store.network()
    assert "/network/indices16" in calls
    for a, b in zip(net.layers, got.layers):
        np.testing.assert_array_equal(a.indptr, b.indptr)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.bias_vector(), b.bias_vector())


def test_a_truncated_read_is_refused(tmp_path):
    data = np.arange(20_000, dtype=np.int64)
    f = _dataset(tmp_path / "t.h5", data, chunks=(1024,))
    ds = f["d"]
    runs = direct._runs(ds, 20_000)
    end = max(offset + size for _at, offset, size in runs)
    with open(tmp_path / "t.h5", "r+b") as raw:
        raw.truncate(end - 100)
    with pytest.raises(StoreError, match="truncated"):
        direct.read_prefix(ds, 20_000, 2)
    f.close()


def test_layers_checked_on_threads_refuse_the_first_damaged_one(tmp_path, monkeypatch):
    from spdnn_mpi.formats.store import reader

    monkeypatch.setattr(reader, "PARALLEL_CHECK_NNZ", 0)  # every store on threads
    monkeypatch.setattr("spdnn_mpi.util.workers.default_jobs", lambda: 3)
    net = _store(tmp_path / "s.h5", n_layers=8)
    with Store(tmp_path / "s.h5") as store:
        assert len(store.network().layers) == 8
    starts = np.cumsum([0] + [layer.nnz for layer in net.layers])
    with h5py.File(tmp_path / "s.h5", "r+") as f:
        ds = f["network/indices16"]
        for k in (6, 3):  # 0-based layers 3 and 6 (4 and 7 to the user)
            ds[starts[k]] = 299 + 1000
    with Store(tmp_path / "s.h5") as store, pytest.raises(StoreError, match="network/l00004"):
        store.network()
