"""`spdnn infer` on argmax stores: image_id<TAB>class lines, --check, accuracy."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from model_stores import classifier_store

from spdnn_mpi.cli import main


def read_predictions(path):
    table = np.loadtxt(path, dtype=np.int64, delimiter="\t", ndmin=2)
    return table[:, 0], table[:, 1]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_infer_writes_one_class_per_image_and_checks(tmp_path, capsys, backend):
    _, rows, preds, y = classifier_store(tmp_path / "m.h5")
    status = main(["infer", str(tmp_path / "m.h5"), "--backend", backend, "--check",
                   "--out", str(tmp_path / "p.tsv"), "--json", str(tmp_path / "r.json"),
                   "--quiet", "--batch", "100"])
    out = capsys.readouterr().out
    assert status == 0
    ids, classes = read_predictions(tmp_path / "p.tsv")
    np.testing.assert_array_equal(ids, np.arange(1, rows.n_rows + 1))
    np.testing.assert_array_equal(classes, preds)
    assert f"check       PASSED ({rows.n_rows} predictions match the stored reference)" in out
    expected = np.mean(preds == y)
    assert f"accuracy    {100 * expected:.2f}%" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["readout"] == "argmax" and report["check"]["passed"]
    assert report["accuracy"]["correct"] == int(np.sum(preds == y))


def test_check_fails_on_a_changed_prediction(tmp_path, capsys):
    _, _, preds, _ = classifier_store(tmp_path / "m.h5", labels=False)
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        d = f["predictions"]["l3"]
        d[5] = (preds[5] + 1) % 10
    assert main(["infer", str(tmp_path / "m.h5"), "--backend", "cpu", "--check",
                 "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "check       FAILED: 1 of 257 predictions differ (first image ids [6])" in out
    assert "accuracy" not in out  # no labels stored


def test_check_without_stored_predictions_is_an_error(tmp_path, capsys):
    classifier_store(tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        del f["predictions"]
    assert main(["infer", str(tmp_path / "m.h5"), "--backend", "cpu", "--check",
                 "--quiet"]) == 2
    assert "no reference predictions stored for 3 layers" in capsys.readouterr().err


def test_info_shows_readout_labels_and_predictions(tmp_path, capsys):
    classifier_store(tmp_path / "m.h5")
    assert main(["info", str(tmp_path / "m.h5")]) == 0
    out = capsys.readouterr().out
    assert "readout      argmax; activations none x 1, relu x 2" in out
    assert "predictions  3 layers: one class per image (reference)" in out
    assert "labels       257 true classes" in out


def test_summary_labels_fit_a_small_classifier_on_the_cpu(tmp_path, capsys, monkeypatch):
    """Before: '40 neurons x 3 layers', '0.000 TeraEdges/s', 'inputs to device' on the CPU
    and 'cpu (CuPy is not installed (cupy))'."""
    from spdnn_mpi import backends

    monkeypatch.setattr(backends, "cuda_available", lambda: (False, "CuPy is not installed"))
    classifier_store(tmp_path / "m.h5")
    assert main(["infer", str(tmp_path / "m.h5"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "network     40-64-32-10 (3 layers), 257 images" in out
    assert "backend     cpu (auto: no GPU, CuPy is not installed), 1 rank(s)" in out
    assert "inputs laid out" in out and "device" not in out.split("machine")[0]
    rate = next(line for line in out.splitlines() if line.startswith("rate"))
    assert "TeraEdges" not in rate and ("MegaEdges/s" in rate or "GigaEdges/s" in rate)


def test_rates_are_shown_in_a_unit_that_fits():
    from spdnn_mpi.commands.infer import format_rate

    assert format_rate(1.5e14) == "150.000 TeraEdges/s"
    assert format_rate(2.5e10) == "25.000 GigaEdges/s"
    assert format_rate(3e7) == "30.000 MegaEdges/s"
    assert format_rate(12.0) == "12 edges/s"


@pytest.mark.parametrize("dataset,value,message", [
    ("labels", 10, "labels: class 10 of image 1 outside 0..9 (the network has 10 outputs)"),
    ("labels", 10**9, "labels: class 1000000000 of image 1 outside 0..9"),
    ("predictions/l3", 10, "predictions/l3: class 10 of image 1 outside 0..9"),
])
def test_classes_beyond_the_outputs_are_refused(tmp_path, capsys, dataset, value, message):
    """A label of 10 with 10 classes was scored; a prediction of 10 gave --check FAILED."""
    classifier_store(tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        f[dataset][0] = value
    assert main(["infer", str(tmp_path / "m.h5"), "--backend", "cpu", "--check",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'm.h5'}: {message}" in err and len(err.splitlines()) == 1, err


def test_schema_2_store_without_readout_is_refused(tmp_path, capsys):
    """Deleting network@readout ran an argmax store as an `alive` one."""
    classifier_store(tmp_path / "m.h5")
    with h5py.File(tmp_path / "m.h5", "r+") as f:
        del f["network"].attrs["readout"]
    assert main(["infer", str(tmp_path / "m.h5"), "--backend", "cpu", "--quiet"]) == 2
    assert "network: attribute readout missing (schema 2 stores name their readout)" \
        in capsys.readouterr().err
