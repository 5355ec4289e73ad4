"""`spdnn bench` on imported models: our backend, the onnxruntime peer, the plot."""

from __future__ import annotations

import json

import numpy as np
import pytest
from model_stores import classifier_store

from spdnn_mpi.bench.models import table, tile_rows
from spdnn_mpi.cli import main
from spdnn_mpi.model import SparseRows

pytest.importorskip("onnxruntime")


def test_bench_model_store_against_onnxruntime_with_plot(tmp_path, capsys):
    classifier_store(tmp_path / "m.h5")
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    status = main(["bench", str(tmp_path / "m.h5"), "--backend", "cpu", "--peer", "onnxruntime",
                   "--peer", "torch-dense", "--repeat", "2", "--model-images", "600",
                   "--json", str(out), "--plot", str(png), "--quiet"])
    table = capsys.readouterr().out
    assert status == 0, table
    assert "xonnxruntime" in table and "pass" in table and "DISAGREE" not in table
    row = json.loads(out.read_text())["models"][0]
    assert row["images"] == 600 and row["check"]["passed"]
    assert len(row["layer_seconds"]) == len(row["widths"]) - 1  # per-layer times, cpu
    peer = row["peers"]["onnxruntime"]
    assert peer["agrees"] and peer["max_rel_diff"] < 1e-5 and peer["seconds"] > 0
    assert peer["accuracy"] == row["accuracy"]
    ours_runs = f"{1e3 * min(row['seconds_all']):.3f}-{1e3 * max(row['seconds_all']):.3f}"
    theirs = peer["seconds_all"]
    assert len(row["seconds_all"]) == len(theirs) == 2
    assert "runs_ms" in table and "onnxruntime_runs_ms" in table
    assert ours_runs in table and f"{1e3 * min(theirs):.3f}-{1e3 * max(theirs):.3f}" in table
    torch_peer = row["peers"]["torch-dense"]
    assert "skipped" in torch_peer or torch_peer["agrees"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_shipped_model(tmp_path, capsys):
    assert main(["bench", "--model", "99", "--backend", "cpu", "--peer", "onnxruntime",
                 "--repeat", "1", "--data-dir", str(tmp_path), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "99.000" in table and "pass" in table
    assert list((tmp_path / "models").glob("*s99-test.h5"))


def test_tile_rows_repeats_the_inputs():
    dense = np.array([[1, 0, 2], [0, 0, 0], [0, 3, 0]], np.float32)
    rows = SparseRows.from_dense(dense)
    np.testing.assert_array_equal(tile_rows(rows, 7).to_dense(), np.tile(dense, (3, 1))[:7])
    np.testing.assert_array_equal(tile_rows(rows, 2).to_dense(), dense[:2])


def test_models_table_shows_each_time_s_range():
    row = {"sparsity": 0.95, "edges": 93082, "images": 1000, "backend": "cuda",
           "seconds": 2e-4, "seconds_all": [1.9e-4, 2e-4, 2.6e-4], "accuracy": 0.954,
           "check": {"passed": True},
           "peers": {"torch-dense": {"seconds": 3e-4, "seconds_all": [2.5e-4, 3e-4, 4e-4],
                                     "speedup": 1.5, "agrees": True},
                     "torch": {"skipped": "no GPU"}}}
    text = table([row], ["torch-dense", "torch"])
    head, _, line = text.splitlines()[:3]
    assert head.split()[4:6] == ["time_ms", "runs_ms"]
    assert "torch-dense_runs_ms" in head and "torch_runs_ms" in head
    assert "0.190-0.260" in line and "0.250-0.400" in line
    assert "fastest-slowest" in text


def test_models_plot_names_what_each_peer_runs():
    """torch is torch.sparse, not a dense model; the dense peers say which library."""
    from spdnn_mpi.bench.models import speedup_series

    peers = {"onnxruntime": {"speedup": 5.0}, "torch-dense": {"speedup": 1.4},
             "torch": {"speedup": 0.9}, "graphblas": {"skipped": "not a model peer"}}
    rows = [{"sparsity": s, "peers": peers} for s in (0.99, 0.9)]
    series = dict(speedup_series(rows))
    assert set(series) == {"over onnxruntime (dense, CPU)", "over PyTorch dense (cuBLAS)",
                           "over torch.sparse (CSR)"}
    assert series["over torch.sparse (CSR)"] == [(90.0, 0.9), (99.0, 0.9)]
    assert not any("torch (dense)" in label for label in series)
