"""Store schema 2 (activations, readout, labels, predictions); schema 1 stores still read."""

from __future__ import annotations

import re

import h5py
import numpy as np
import pytest
from conftest import as_schema_2, fixed_degree_layer, random_inputs, random_network

from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store.reader import SCHEMA_VERSION, Store, StoreWriter, layer_key


def classifier_store(path, rng):
    net = random_network(rng, [30, 20, 4], 0.4, bias="positive", clip=None,
                         activations=["relu", "none"])
    rows = random_inputs(rng, 25, 30, 0.3, binary=False)
    labels = rng.integers(0, 4, 25)
    preds = rng.integers(0, 4, 25)
    with StoreWriter(path, {"tool": "test"}, readout="argmax") as w:
        for layer in net.layers:
            w.add_layer(layer)
        w.write_inputs(rows)
        w.write_labels(labels)
        w.add_predictions(2, preds, "reference")
    return net, rows, labels, preds


def test_schema_2_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    net, rows, labels, preds = classifier_store(tmp_path / "m.h5", rng)
    with Store(tmp_path / "m.h5") as st:
        assert st.schema_version == SCHEMA_VERSION == 3
        back = st.network()
        assert back.readout == "argmax"
        assert [lay.activation for lay in back.layers] == ["relu", "none"]
        for a, b in zip(back.layers, net.layers):
            np.testing.assert_array_equal(a.bias_vector(), b.bias_vector())
            np.testing.assert_array_equal(a.weight_values(), b.weight_values())
        np.testing.assert_array_equal(st.inputs().to_dense(), rows.to_dense())
        assert st.inputs().values is not None  # valued inputs kept, not binarised
        np.testing.assert_array_equal(st.labels(), labels)
        np.testing.assert_array_equal(st.predictions(2), preds)
        assert st.predictions(1) is None and st.prediction_layers() == [2]
        assert st.predictions_source(2) == "reference"
        info = st.summary()
        assert info["readout"] == "argmax" and info["labels"] == 25
        assert info["activations"] == {"relu": 1, "none": 1}


def test_schema_1_store_still_reads(tmp_path):
    """A version 1 file has no activation or readout attributes: ReLU and alive."""
    rng = np.random.default_rng(1)
    net = random_network(rng, [16, 16, 16], 0.3)
    path = tmp_path / "old.h5"
    with StoreWriter(path) as w:
        for layer in net.layers:
            w.add_layer(layer)
        w.write_inputs(random_inputs(rng, 10, 16))
    as_schema_2(path)
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = 1
        del f["network"].attrs["readout"]
        for k in range(2):
            del f["network"][layer_key(k)].attrs["activation"]
    with Store(path) as st:
        assert st.schema_version == 1 and st.readout == "alive"
        assert [lay.activation for lay in st.network().layers] == ["relu", "relu"]
        assert st.labels() is None and st.prediction_layers() == []


def test_unknown_schema_version_and_bad_attributes_are_refused(tmp_path):
    rng = np.random.default_rng(2)
    classifier_store(tmp_path / "m.h5", rng)
    as_schema_2(tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        f["network"][layer_key(1)].attrs["activation"] = "gelu"
    with Store(tmp_path / "m.h5") as st, pytest.raises(StoreError, match="activation 'gelu'"):
        st.network()
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        f["network"].attrs["readout"] = "softmax"
    with pytest.raises(StoreError, match="readout 'softmax'"):
        Store(tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        f.attrs["schema_version"] = 4
    with pytest.raises(StoreError, match="schema version 4.*reads version 1, 2, 3"):
        Store(tmp_path / "m.h5")


def test_labels_must_match_the_inputs(tmp_path):
    rng = np.random.default_rng(3)
    net = random_network(rng, [8, 3], 0.5)
    with pytest.raises(StoreError, match="7 labels for 5 images"):
        with StoreWriter(tmp_path / "x.h5", readout="argmax") as w:
            w.add_layer(net.layers[0])
            w.write_inputs(random_inputs(rng, 5, 8))
            w.write_labels(np.zeros(7, np.int64))
    assert not (tmp_path / "x.h5").exists()
    with pytest.raises(StoreError, match="readout 'best'"):
        StoreWriter(tmp_path / "y.h5", readout="best")


def test_writer_refuses_classes_beyond_the_outputs(tmp_path):
    rng = np.random.default_rng(4)
    net = random_network(rng, [8, 3], 0.5)
    for write, message in ((lambda w: w.write_labels(np.array([0, 1, 3, 0, 0])),
                            "labels: class 3 of image 3 outside 0..2"),
                           (lambda w: w.add_predictions(1, np.array([0, -1, 0, 0, 0]), "t"),
                            "predictions/l1: class -1 of image 2 outside 0..2"),
                           (lambda w: w.add_predictions(2, np.zeros(5, np.int64), "t"),
                            "predictions/l2: for 2 layers, the store has 1")):
        with pytest.raises(StoreError, match=re.escape(message)):
            with StoreWriter(tmp_path / "x.h5", readout="argmax") as w:
                w.add_layer(net.layers[0])
                w.write_inputs(random_inputs(rng, 5, 8))
                write(w)
    assert list(tmp_path.iterdir()) == []


def test_fixed_degree_layers_carry_the_stored_degree(tmp_path):
    """A layer stored in the ``row_degree`` form comes back knowing its degree (not
    found again from its row pointer), the same as the pointer gives; others find it."""
    rng = np.random.default_rng(3)
    fixed = fixed_degree_layer(rng, 40, 40, 6)
    ragged = random_network(rng, [40, 30], 0.2).layers[0]
    with StoreWriter(tmp_path / "s.h5") as w:
        w.add_layer(fixed)
        w.add_layer(ragged)
        w.write_inputs(random_inputs(rng, 3, 40))
    with Store(tmp_path / "s.h5") as st:
        read = st.network().layers
    assert vars(read[0])["row_degree"] == 6 == int(np.diff(read[0].indptr)[0])
    assert "row_degree" not in vars(read[1])
    assert read[1].row_degree == ragged.row_degree
