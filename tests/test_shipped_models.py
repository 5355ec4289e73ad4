"""The shipped pruned MNIST models: predictions equal the stored reference and
onnxruntime's labels, accuracy as recorded in models.json; `spdnn demo --model`."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from spdnn_mpi.backends import make_backend
from spdnn_mpi.cli import main
from spdnn_mpi.engine import run_inference
from spdnn_mpi.formats.store.reader import Store
from spdnn_mpi.generators import mnist_models as mm
from spdnn_mpi.readout import accuracy, classes_of_rows

SHIPPED = [e for e in mm.bundled_models() if e.get("file")]


def test_manifest_and_files():
    sparsities = [round(100 * e["sparsity"]) for e in SHIPPED]
    assert sparsities == [90, 95, 98, 99]
    total = sum((mm.models_dir() / e["file"]).stat().st_size for e in SHIPPED)
    assert total < 10e6
    dense = [e for e in mm.bundled_models() if e["sparsity"] == 0]
    assert dense and dense[0]["file"] is None  # trained and recorded, not shipped
    for e in SHIPPED:
        assert e["accuracy"] > 0.9 and e["test_images"] == 1000
        assert abs(sum(e["nnz_per_layer"]) / (784 * 1024 + 1024 * 1024 + 1024 * 10)
                   - (1 - e["sparsity"])) < 1e-6


@pytest.mark.parametrize("entry", SHIPPED, ids=lambda e: e["file"])
def test_shipped_model_predictions_and_accuracy(entry, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    store = mm.model_store(entry, tmp_path)
    with Store(store) as st:
        net, rows = st.network(), st.inputs()
        expected, labels = st.predictions(st.n_layers), st.labels()
    assert net.readout == "argmax" and rows.n_rows == 1000
    assert [lay.nnz for lay in net.layers] == entry["nnz_per_layer"]  # zeros dropped, no others
    backend = make_backend("cpu")
    backend.load_network(net.layers)
    res = run_inference(net, rows, backend, want_features=True)
    ours = classes_of_rows(rows.n_rows, res.alive_ids, res.features)
    np.testing.assert_array_equal(ours, expected)
    assert accuracy(ours, labels) == entry["accuracy"]
    data = gzip.decompress((mm.models_dir() / entry["file"]).read_bytes())
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    label = sess.run(["label"], {sess.get_inputs()[0].name: mm.mnist_split()["x_test"]})[0]
    np.testing.assert_array_equal(ours, label.reshape(-1))


def test_model_network_is_the_stores(tmp_path):
    """The tools' shortcut gives the network and digits the imported store holds."""
    entry = SHIPPED[0]
    net, rows = mm.model_network(entry)
    with Store(mm.model_store(entry, tmp_path)) as st:
        want_net, want_rows = st.network(), st.inputs()
    assert [lay.nnz for lay in net.layers] == [lay.nnz for lay in want_net.layers]
    for got, want in zip(net.layers, want_net.layers):
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.weight_values(), want.weight_values())
        np.testing.assert_array_equal(got.bias_vector(), want.bias_vector())
    np.testing.assert_array_equal(rows.to_dense(), want_rows.to_dense())


def test_demo_model_runs_without_training(tmp_path, capsys):
    assert main(["demo", "--model", "95", "--cache-dir", str(tmp_path), "--backend", "cpu"]) == 0
    out = capsys.readouterr()
    entry = mm.find_model(95)
    assert "check       PASSED (1000 predictions match the stored reference)" in out.out
    assert f"accuracy    {100 * entry['accuracy']:.2f}%" in out.err + out.out
    assert "mnist-784-1024-1024-10-s95" in out.err
    assert main(["demo", "--model", "42", "--cache-dir", str(tmp_path)]) == 2
    assert "no shipped model with 42% sparsity; shipped: 90, 95, 98, 99" in capsys.readouterr().err
