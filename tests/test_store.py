"""A damaged or edited store is refused when read, before any kernel sees its arrays.

Each case edits one dataset or attribute of a valid store the way a hostile
user or a damaged disk would; ``spdnn infer`` must stop with one line naming
the store and the dataset and exit 2 (before validation existed, several of
these segfaulted the CPU kernel or gave wrong categories with a PASSED).
"""

from __future__ import annotations

import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import (
    as_schema_2,
    fixed_degree_layer,
    layer_span,
    random_inputs,
    random_network,
    set_layer_field,
    set_layer_item,
)

from spdnn_mpi.cli import main
from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store.reader import SUPPORTED_SCHEMA_VERSIONS, Store, StoreWriter
from spdnn_mpi.model import Network
from spdnn_mpi.reference import reference_categories

W = 48  # network width; indices are uint16


def write_store(path, net, rows, truth_layers=()):
    with StoreWriter(path, {"test": True}) as w:
        for layer in net.layers:
            w.add_layer(layer)
        w.write_inputs(rows)
        for n in truth_layers:
            w.add_truth(n, reference_categories(net.truncated(n), rows), "reference")
    return path


@pytest.fixture
def store(tmp_path):
    """4 layers of width 48: l00001 uniform with scalar bias, l00002 valued with a bias vector."""
    rng = np.random.default_rng(3)
    net = random_network(rng, [W] * 5, 0.2, uniform=True)
    valued = random_network(rng, [W, W], 0.2, bias="vector")
    net.layers[1] = valued.layers[0]
    rows = random_inputs(rng, 120, W, 0.25, binary=False)
    return write_store(tmp_path / "s.h5", net, rows, [4])


def replace(group, name, data):
    attrs = dict(group[name].attrs)
    del group[name]
    d = group.create_dataset(name, data=data)
    d.attrs.update(attrs)


def set_item(group, name, pos, value):
    a = group[name][()]
    a[pos] = value
    group[name][...] = a


# each case: (edit of the open h5py.File, fragments the error must contain)
#: Layers kept one group a layer (schema 2, still read).
GROUP_CASES = {
    "indptr middle 10^9": (lambda f: set_item(f["network/l00002"], "indptr", 5, 10**9),
                           ["network/l00002/indptr", "decreases"]),
    "indptr swapped pair": (
        lambda f: set_item(f["network/l00002"], "indptr", slice(3, 5),
                           f["network/l00002/indptr"][3:5][::-1] + [0, 0]),
        ["network/l00002/indptr"]),
    "indptr first not 0": (lambda f: set_item(f["network/l00002"], "indptr", 0, 1),
                           ["network/l00002/indptr", "expected 0"]),
    "index beyond n_in": (lambda f: set_item(f["network/l00003"], "indices", 7, W + 12),
                          ["network/l00003/indices", f"id {W + 12} at position 7"]),
    "index uint16 max": (lambda f: set_item(f["network/l00001"], "indices", 0, 65535),
                         ["network/l00001/indices", "65535"]),
    "negative int32 indices": (
        lambda f: replace(f["network/l00001"], "indices",
                          -np.ones(f["network/l00001/indices"].shape, np.int32)),
        ["network/l00001/indices", "dtype int32", "uint16"]),
    "int8 indices": (
        lambda f: replace(f["network/l00001"], "indices",
                          f["network/l00001/indices"][()].astype(np.int8)),
        ["network/l00001/indices", "dtype int8"]),
    "indices shorter than nnz": (
        lambda f: replace(f["network/l00003"], "indices", f["network/l00003/indices"][:-1]),
        ["network/l00003/indices", "attribute nnz"]),
    "nan weight": (lambda f: set_item(f["network/l00002"], "values", 3, np.nan),
                   ["network/l00002/values", "nan at position 3"]),
    "inf uniform weight": (lambda f: f["network/l00001"].attrs.__setitem__(
        "uniform_value", np.float32(np.inf)), ["network/l00001", "uniform_value"]),
    "nan bias vector": (lambda f: set_item(f["network/l00002"], "bias", 0, np.nan),
                        ["network/l00002/bias", "not finite"]),
    "inf scalar bias": (lambda f: f["network/l00001"].attrs.__setitem__("bias", np.inf),
                        ["network/l00001", "attribute bias"]),
    "nan clip": (lambda f: f["network/l00001"].attrs.__setitem__("clip", np.nan),
                 ["network/l00001", "attribute clip"]),
    "nnz as a string": (lambda f: f["network/l00003"].attrs.__setitem__("nnz", "400"),
                        ["network/l00003", "attribute nnz"]),
    "indices dataset gone": (lambda f: f["network/l00004"].__delitem__("indices"),
                             ["network/l00004/indices", "missing"]),
    "layer group gone": (lambda f: f["network"].__delitem__("l00003"),
                         ["layer group network/l00003 missing"]),
    # a 2-D dataset of the right dtype was reported as "dtype uint16, the schema says uint16"
    "2-D layer indices": (
        lambda f: replace(f["network/l00001"], "indices",
                          f["network/l00001/indices"][()].reshape(-1, 1)),
        ["network/l00001/indices: shape (", "expected one dimension"]),
    "2-D bias vector": (
        lambda f: replace(f["network/l00002"], "bias",
                          f["network/l00002/bias"][()].reshape(-1, 1)),
        ["network/l00002/bias: shape (48, 1), expected (48,)"]),
}

#: Layers packed into a few datasets with a table of offsets (schema 3, written now).
PACKED_CASES = {
    "indptr middle 10^9": (lambda f: set_layer_item(f, 2, "indptr", 5, 10**9),
                           ["network/l00002/indptr", "decreases"]),
    "indptr first not 0": (lambda f: set_layer_item(f, 2, "indptr", 0, 1),
                           ["network/l00002/indptr", "expected 0"]),
    "index beyond n_in": (lambda f: set_layer_item(f, 3, "indices", 7, W + 12),
                          ["network/l00003/indices", f"id {W + 12} at position 7"]),
    "index uint16 max": (lambda f: set_layer_item(f, 1, "indices", 0, 65535),
                         ["network/l00001/indices", "65535"]),
    "indices as int32": (
        lambda f: replace(f["network"], "indices16",
                          f["network/indices16"][()].astype(np.int32)),
        ["network/l00001/indices", "dtype int32", "uint16"]),
    "2-D indices": (
        lambda f: replace(f["network"], "indices16",
                          f["network/indices16"][()].reshape(-1, 1)),
        ["network/l00001/indices: shape (", "expected one dimension"]),
    "indices cut short": (
        lambda f: replace(f["network"], "indices16", f["network/indices16"][:-1]),
        ["network/l00004", "outside network/indices16"]),
    "indices dataset gone": (lambda f: f["network"].__delitem__("indices16"),
                             ["network/l00001", "outside network/indices16"]),
    "start beyond the data": (lambda f: set_layer_field(f, 3, "indices_start", 10**9),
                              ["network/l00003", "outside network/indices16"]),
    "negative start": (lambda f: set_layer_field(f, 2, "values_start", -5),
                       ["network/l00002", "values entries [-5,"]),
    "values start gone": (lambda f: set_layer_field(f, 2, "values_start", -1),
                          ["network/l00002", "uniform_value is nan"]),
    "bias start gone": (lambda f: set_layer_field(f, 2, "bias_start", -1),
                        ["network/l00002", "attribute bias is nan"]),
    "nnz 10^12": (lambda f: set_layer_field(f, 3, "nnz", 10**12),
                  ["network/l00003", "outside network/indices16"]),
    "n_out 0": (lambda f: set_layer_field(f, 4, "n_out", 0), ["network/l00004", "n_out"]),
    "nan weight": (lambda f: set_layer_item(f, 2, "values", 3, np.nan),
                   ["network/l00002/values", "nan at position 3"]),
    "inf uniform weight": (lambda f: set_layer_field(f, 1, "uniform_value", np.inf),
                           ["network/l00001", "uniform_value"]),
    "nan bias vector": (lambda f: set_layer_item(f, 2, "bias", 0, np.nan),
                        ["network/l00002/bias", "not finite"]),
    "inf scalar bias": (lambda f: set_layer_field(f, 1, "bias", np.inf),
                        ["network/l00001", "attribute bias"]),
    "nan clip": (lambda f: set_layer_field(f, 1, "clip", np.nan),
                 ["network/l00001", "attribute clip"]),
    "unknown activation": (lambda f: set_layer_field(f, 2, "activation", 7),
                           ["network/l00002", "activation 'code 7'"]),
    "table of another dtype": (
        lambda f: replace(f["network"], "layers", np.zeros(4, np.int64)),
        ["network/layers", "not the schema's layer table"]),
    "table gone": (lambda f: f["network"].__delitem__("layers"),
                   ["network/layers", "missing"]),
    "table shorter than n_layers": (
        lambda f: replace(f["network"], "layers", f["network/layers"][:3]),
        ["network/layers has 3 rows, attribute n_layers says 4"]),
}

#: The rest of a store, the same in both layouts.
COMMON_CASES = {
    "input pixel beyond n_cols": (lambda f: set_item(f["inputs"], "indices", 11, 5000),
                                  ["inputs/indices", "id 5000 at position 11"]),
    "input pixel 65535": (lambda f: set_item(f["inputs"], "indices", 0, 65535),
                          ["inputs/indices", "65535"]),
    "input indptr decreasing": (lambda f: set_item(f["inputs"], "indptr", 40, 0),
                                ["inputs/indptr", "decreases"]),
    "input indptr beyond nnz": (lambda f: set_item(f["inputs"], "indptr", -1, 10**9),
                                ["inputs/indptr", "expected 0 to"]),
    "n_rows 10^12": (lambda f: f["inputs"].attrs.__setitem__("n_rows", 10**12),
                     ["inputs/indptr", "n_rows 1000000000000"]),
    "n_cols 1024": (lambda f: f["inputs"].attrs.__setitem__("n_cols", 1024),
                    ["inputs", "n_cols 1024", "layer 1 has 48 inputs"]),
    "input value inf": (lambda f: set_item(f["inputs"], "values", 2, np.inf),
                        ["inputs/values", "inf at position 2"]),
    "input pixels int32": (
        lambda f: replace(f["inputs"], "indices", f["inputs/indices"][()].astype(np.int32)),
        ["inputs/indices", "dtype int32"]),
    "schema_version '1'": (lambda f: f.attrs.__setitem__("schema_version", "1"),
                           ["schema version '1'"]),
    "schema_version 1.5": (lambda f: f.attrs.__setitem__("schema_version", 1.5),
                           ["schema version 1.5"]),
    "schema_version 99": (lambda f: f.attrs.__setitem__("schema_version", 99),
                          ["schema version 99"]),
    "n_layers 0": (lambda f: f["network"].attrs.__setitem__("n_layers", 0),
                   ["network", "attribute n_layers is 0"]),
    "provenance not JSON": (lambda f: f.attrs.__setitem__("provenance", "{oops"),
                            ["provenance is not a JSON object"]),
    "2-D input pixels": (
        lambda f: replace(f["inputs"], "indices", f["inputs/indices"][()].reshape(-1, 1)),
        ["inputs/indices: shape (", "expected one dimension"]),
    "2-D truth": (lambda f: replace(f["truth"], "l4", f["truth/l4"][()].reshape(-1, 1)),
                  ["truth/l4: shape (", "expected one dimension"]),
    "n_layers gone": (lambda f: f["network"].attrs.__delitem__("n_layers"),
                      ["network: attribute n_layers missing"]),
}


@pytest.mark.parametrize("case", [f"packed: {c}" for c in PACKED_CASES]
                         + [f"groups: {c}" for c in GROUP_CASES]
                         + [f"{layout}: {c}" for layout in ("packed", "groups")
                            for c in COMMON_CASES])
def test_damaged_store_is_refused_before_any_kernel(store, capsys, case):
    layout, name = case.split(": ", 1)
    if layout == "groups":
        as_schema_2(store)
    edit, fragments = ({**COMMON_CASES, **PACKED_CASES} if layout == "packed"
                       else {**COMMON_CASES, **GROUP_CASES})[name]
    with h5py.File(store, "r+") as f:
        edit(f)
    assert main(["infer", str(store), "--backend", "cpu", "--threads", "1", "--check",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(store) in lines[0] and "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_bit_rot_in_the_index_data_is_caught(store, capsys):
    """Raw bytes of layer 2's indices overwritten on disk (no HDF5 checksum to notice)."""
    with h5py.File(store, "r") as f:
        ds, start, _ = layer_span(f, 2, "indices")
        offset = ds.id.get_chunk_info(0).byte_offset + 2 * start  # the first chunk holds it
    with open(store, "r+b") as fh:
        fh.seek(offset + 20)
        fh.write(b"\xff\xff\x37\x13")
    assert main(["infer", str(store), "--backend", "cpu", "--quiet"]) == 2
    assert "network/l00002/indices" in capsys.readouterr().err


def test_int32_index_range_is_checked(tmp_path, capsys):
    """Above 65536 inputs the documented index type is int32: negative or large ids refused."""
    rng = np.random.default_rng(8)
    wide = 70000
    net = random_network(rng, [wide, 8, 8], 0.0005, uniform=True)
    rows = random_inputs(rng, 20, wide, 0.001)
    path = write_store(tmp_path / "wide.h5", net, rows, [2])
    assert net.layers[0].indices.dtype == np.int32
    assert main(["infer", str(path), "--backend", "cpu", "--check", "--quiet"]) == 0
    for bad in (-1, wide, 2**31 - 1):
        with h5py.File(path, "r+") as f:
            set_layer_item(f, 1, "indices", 1, bad)
        assert main(["infer", str(path), "--backend", "cpu", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"network/l00001/indices: id {bad} at position 1" in err, err


def test_damaged_truth_is_refused(store, capsys):
    with h5py.File(store, "r+") as f:
        t = f["truth/l4"][()]
        replace(f["truth"], "l4", t[::-1].copy())
    assert main(["infer", str(store), "--backend", "cpu", "--check", "--quiet"]) == 2
    assert "truth/l4: ids not strictly increasing" in capsys.readouterr().err


def test_refusal_from_the_command_line_has_no_traceback(store):
    with h5py.File(store, "r+") as f:
        set_layer_item(f, 2, "indptr", 5, 10**9)
    proc = subprocess.run([sys.executable, "-m", "spdnn_mpi", "infer", str(store),
                           "--backend", "cpu", "--quiet"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "network/l00002/indptr" in proc.stderr


def test_valid_stores_pass_and_validation_is_timed(store):
    assert 1 in SUPPORTED_SCHEMA_VERSIONS
    with Store(store) as s:
        assert s.validate_seconds == 0.0
        net = s.network()
        rows = s.inputs()
        assert s.truth(4) is not None
        assert s.validate_seconds > 0.0
        np.testing.assert_array_equal(s.truth(4), reference_categories(net, rows))
        # a rank's slice is validated on its own
        part = s.inputs(30, 77)
        assert part.first_row == 30 and part.n_rows == 47


def test_store_api_raises_store_error(store):
    with h5py.File(store, "r+") as f:
        set_layer_item(f, 3, "indices", 0, 200)
    with Store(store) as s:
        s.layer(0)
        with pytest.raises(StoreError, match="l00003/indices"):
            s.network()


@pytest.mark.parametrize("command", [["info"], ["infer", "--quiet", "--backend", "cpu"],
                                     ["bench", "--quiet", "--backend", "cpu"]])
def test_fifo_store_is_refused_not_waited_on(tmp_path, command):
    """Opening a FIFO blocks until a writer comes: the store must be a regular file."""
    import os

    fifo = tmp_path / "s.h5"
    os.mkfifo(fifo)
    run = subprocess.run([sys.executable, "-m", "spdnn_mpi.cli", command[0], str(fifo),
                          *command[1:]], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert f"{fifo}: not a regular file (a FIFO), not a store" in run.stderr
    assert "Traceback" not in run.stderr


def _layer(**change):
    """A valid 3 -> 2 layer with values and a bias vector, with ``change`` applied."""
    from spdnn_mpi.model import Layer

    fields = dict(n_in=3, n_out=2, indptr=np.array([0, 2, 3]),
                  indices=np.array([0, 2, 1], np.uint16), values=np.array([0.5, -1, 2], np.float32),
                  uniform_value=None, bias=np.array([-0.1, 0.2], np.float32), clip=None)
    fields.update(change)
    return Layer(**fields)


@pytest.mark.parametrize("change,message", [
    ({"values": np.array([0.5, np.nan, 2], np.float32)},
     "network/l00001/values: value nan at position 1 is not finite"),
    ({"values": np.array([0.5, 1e39, 2])}, "network/l00001/values: value inf at position 1"),
    ({"values": None, "uniform_value": 1e39},
     "network/l00001: attribute uniform_value is inf, expected a finite number"),
    ({"bias": np.array([np.inf, 0], np.float32)}, "network/l00001/bias: value inf at position 0"),
    ({"bias": 1e39}, "network/l00001: attribute bias is inf, expected a finite number"),
    ({"clip": 1e39}, "network/l00001: attribute clip is inf, expected a finite number > 0"),
    ({"clip": 0.0}, "network/l00001: attribute clip is 0.0, expected a finite number > 0"),
    ({"n_out": 0, "indptr": np.array([0]), "indices": np.zeros(0, np.uint16),
      "values": np.zeros(0, np.float32), "bias": np.zeros(0, np.float32)},
     "network/l00001: attribute n_out is 0, expected >= 1"),
    ({"indices": np.array([0, 3, 1], np.uint16)},
     "network/l00001/indices: id 3 at position 1 outside [0, 3)"),
    ({"indices": np.array([0, 65539, 1])},
     "network/l00001/indices: id 65539 at position 1 outside [0, 3)"),
    ({"indptr": np.array([0, 2, 1]), "indices": np.array([0], np.uint16),
      "values": np.array([0.5], np.float32)},
     "network/l00001/indptr: decreases at entry 2 (2 then 1)"),
])
def test_writer_refuses_what_the_reader_refuses(tmp_path, change, message):
    """The writer runs the reader's checks before it writes a layer: no store it writes is
    refused when read (NaN weights from Gemm alpha=nan imported with exit 0)."""
    out = tmp_path / "s.h5"
    with pytest.raises(StoreError) as info, StoreWriter(out) as w:
        w.add_layer(_layer(**change))
    assert f"{out}: {message}" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_writer_checks_inputs_and_truth_like_the_reader(tmp_path):
    from spdnn_mpi.model import SparseRows

    out = tmp_path / "s.h5"
    nan_rows = SparseRows(3, np.array([0, 1, 2]), np.array([0, 2], np.uint16),
                          np.array([1.0, np.nan], np.float32))
    wide_rows = SparseRows(3, np.array([0, 1, 2]), np.array([0, 70000]))
    for rows, message in ((nan_rows, "inputs/values: value nan at position 1 is not finite"),
                          (wide_rows, "inputs/indices: id 70000 at position 1 outside [0, 3)")):
        with pytest.raises(StoreError, match=re.escape(f"{out}: {message}")), \
                StoreWriter(out) as w:
            w.add_layer(_layer())
            w.write_inputs(rows)
    good = SparseRows(3, np.array([0, 1, 2]), np.array([0, 2], np.uint16))
    with pytest.raises(StoreError, match=re.escape(f"{out}: truth/l1: ids not strictly "
                                                   "increasing")), StoreWriter(out) as w:
        w.add_layer(_layer())
        w.write_inputs(good)
        w.add_truth(1, np.array([2, 1]), "test")
    with pytest.raises(StoreError, match=re.escape(f"{out}: inputs: n_cols 3 but layer 1 "
                                                   "has 4 inputs")), StoreWriter(out) as w:
        w.write_inputs(good)
        w.add_layer(_layer(n_in=4))
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def fixed_store(tmp_path):
    """Five fixed-degree layers of one weight and a scalar bias (the challenge's form),
    whose index arrays lie back to back: read through the one-pass checks."""
    rng = np.random.default_rng(11)
    layers = [fixed_degree_layer(rng, W, W, 6, bias=-0.1 * k, clip=[None, 8.0][k % 2])
              for k in range(5)]
    net = Network(layers)
    return write_store(tmp_path / "fixed.h5", net, random_inputs(rng, 40, W, 0.25), [5]), net


#: edits of a fixed-degree store: each rule the one-pass checks cover, broken in layer 3
FIXED_CASES = {
    "index beyond n_in": (lambda f: set_layer_item(f, 3, "indices", 9, W),
                          [f"network/l00003/indices: id {W} at position 9"]),
    "index 65535 in the last layer": (lambda f: set_layer_item(f, 5, "indices", 0, 65535),
                                      ["network/l00005/indices: id 65535 at position 0"]),
    "degree against nnz": (lambda f: set_layer_field(f, 3, "row_degree", 5),
                           ["network/l00003: row_degree 5 x 48 rows != nnz 288"]),
    "negative degree": (lambda f: set_layer_field(f, 3, "row_degree", -3),
                        ["network/l00003: attribute row_degree missing"]),
    "inf weight": (lambda f: set_layer_field(f, 3, "uniform_value", np.inf),
                   ["network/l00003: attribute uniform_value is inf"]),
    "nan bias": (lambda f: set_layer_field(f, 3, "bias", np.nan),
                 ["network/l00003: attribute bias is nan"]),
    "zero clip": (lambda f: set_layer_field(f, 4, "clip", 0.0),
                  ["network/l00004: attribute clip is 0.0"]),
    "unknown activation": (lambda f: set_layer_field(f, 3, "activation", 9),
                           ["network/l00003: activation 'code 9'"]),
    "n_in 0": (lambda f: set_layer_field(f, 3, "n_in", 0),
               ["network/l00003: attribute n_in is 0"]),
}


@pytest.mark.parametrize("case", list(FIXED_CASES))
def test_fixed_degree_store_checks_name_the_layer(fixed_store, capsys, case):
    """The one-pass checks of a packed table and of runs of ids refuse what the layer
    by layer checks refuse, with the same message (they hand a failure back to them)."""
    path, _ = fixed_store
    edit, fragments = FIXED_CASES[case]
    with h5py.File(path, "r+") as f:
        edit(f)
    assert main(["infer", str(path), "--backend", "cpu", "--threads", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_fixed_degree_layers_read_as_written(fixed_store):
    """Layers built by the one-pass path equal those the layer by layer checks build
    (and the written ones, to float32), sharing one row pointer a shape."""
    path, net = fixed_store
    with Store(path) as s:
        read = s.network().layers
        assert s._layers.simple(5) == [True] * 5
        one_by_one = [s.layer(k) for k in range(5)]
    for got, want, written in zip(read, one_by_one, net.layers):
        for name in ("n_in", "n_out", "uniform_value", "bias", "clip", "activation"):
            assert getattr(got, name) == getattr(want, name), name
            assert type(getattr(got, name)) is type(getattr(want, name)), name
        assert got.bias == np.float32(written.bias)
        np.testing.assert_array_equal(got.indices, written.indices)
        np.testing.assert_array_equal(got.indptr, want.indptr)
        assert vars(got)["row_degree"] == vars(want)["row_degree"] == 6
    assert read[0].indptr is read[4].indptr
    # writeable, as the layer by layer path's are: numba types read-only arrays apart
    assert read[0].indptr.flags.writeable == one_by_one[0].indptr.flags.writeable


def test_runs_of_ids_are_checked_together():
    """``indices_in_range``: back-to-back views of one buffer with one n_in form a run;
    a gap, another n_in or a copy ends it; an id out of range fails its whole run."""
    from spdnn_mpi.formats.store.validate import indices_in_range

    buf = np.arange(40, dtype=np.uint16) % 10
    views = [buf[0:10], buf[10:20], buf[20:30], buf[31:40], buf[0:5].copy()]
    assert indices_in_range([10, 10, 10, 10, 10], views, 2) == [True, True, True, False, False]
    assert indices_in_range([10, 10, 20, 20, 10], views, 1) == [True, True, False, False, False]
    bad = buf.copy()
    bad[25] = 10
    runs = [bad[0:10], bad[10:20], bad[20:30], bad[30:40]]
    assert indices_in_range([10] * 4, runs, 2) == [False] * 4
    signed = np.arange(-1, 19, dtype=np.int32)
    assert indices_in_range([70000, 70000], [signed[:10], signed[10:]], 2) == [False, False]
