"""Floors, the first-layers table and `spdnn bench --plot` on tiny configurations."""

from __future__ import annotations

import json
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest

from spdnn_mpi.bench import plot as bench_plot
from spdnn_mpi.bench.floors import H200_FMA_PER_S, H200_HBM_BYTES_PER_S, first_layers, layer_floor
from spdnn_mpi.cli import main

matplotlib.use("Agg")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_hbm_bound_layer_by_hand():
    # 1024 -> 1024, 32 per output, 60000 rows: 4 * 60000 * 2048 B of features
    # (491 520 000) + 2 B * 32768 indices = 491 585 536 B; 32 * 1024 * 60000 FMAs.
    fl = layer_floor(1024, 1024, 32, 60000)
    assert fl["bytes"] == 491_585_536 and fl["fmas"] == 1_966_080_000
    assert fl["bound"] == "hbm"
    assert fl["seconds"] == pytest.approx(491_585_536 / 4.3e12)  # 114.3 us
    assert fl["fma_seconds"] == pytest.approx(1_966_080_000 / 33.45408e12)  # 58.8 us


def test_fma_bound_layer_by_hand():
    # dense 1024 x 1024, 1000 rows: 8 192 000 + 2 097 152 B, 1.048576e9 FMAs
    fl = layer_floor(1024, 1024, 1024, 1000)
    assert fl["bytes"] == 10_289_152 and fl["fmas"] == 1_048_576_000
    assert fl["bound"] == "fma"
    assert fl["seconds"] == pytest.approx(1_048_576_000 / 33.45408e12)  # 31.3 us
    assert fl["hbm_seconds"] == pytest.approx(10_289_152 / 4.3e12)  # 2.4 us
    assert H200_HBM_BYTES_PER_S == 4.3e12 and H200_FMA_PER_S == pytest.approx(33.45408e12)


def _layer(n_in, n_out, degree, values=None):
    return SimpleNamespace(n_in=n_in, n_out=n_out, nnz=degree * n_out, values=values)


def test_first_layers_rows_and_totals_from_a_fake_result():
    net = SimpleNamespace(layers=[_layer(1024, 1024, 32)] * 3 + [_layer(1024, 1024, 1024)])
    rows_in = [60000, 30000, 1000, 1000]
    seconds = [228.6e-6, 200e-6, 10e-6, 62.7e-6]
    out = first_layers(net, rows_in, seconds, k=2)
    floors = [layer_floor(1024, 1024, 32, r)["seconds"] for r in rows_in[:3]]
    floors.append(layer_floor(1024, 1024, 1024, 1000)["seconds"])
    assert out["k"] == 2 and [r["layer"] for r in out["rows"]] == [1, 2]
    first = out["rows"][0]
    assert first["rows_in"] == 60000 and first["bound"] == "hbm"
    assert first["measured_us"] == pytest.approx(228.6)
    assert first["floor_us"] == pytest.approx(1e6 * floors[0])
    assert first["percent_of_floor"] == pytest.approx(100 * floors[0] / 228.6e-6)  # ~50 %
    assert out["first"]["layers"] == 2
    assert out["first"]["floor_us"] == pytest.approx(1e6 * sum(floors[:2]))
    assert out["all"]["layers"] == 4 and out["all"]["measured_us"] == pytest.approx(501.3)
    assert out["all"]["percent_of_floor"] == pytest.approx(100 * sum(floors) / 501.3e-6)
    untimed = first_layers(net, rows_in, None, k=10)
    assert untimed["k"] == 4 and untimed["rows"][3]["bound"] == "fma"
    assert untimed["rows"][0]["percent_of_floor"] is None
    assert untimed["all"]["measured_us"] is None


def test_first_layers_table_text():
    net = SimpleNamespace(layers=[_layer(1024, 1024, 32)] * 3)
    row = {"neurons": 1024, "layers": 3, "backend": "cuda",
           "modes": {"off": {"layer_seconds": [2e-4, 1e-4, 1e-5],
                             "computed_rows_per_layer": [60000, 20000, 3000]}}}
    bench_plot.add_first_layers(row, net, 2)
    text = bench_plot.first_layers_text([row])
    assert "first 2 layers of 1024x3, off (direct)" in text
    assert "first 2" in text and "all 3" in text and "%floor" in text and "hbm" in text
    assert len(row["first_layers"]["floor_us_per_layer"]) == 3
    row["modes"]["off"]["layer_seconds"] = None
    del row["first_layers"]
    bench_plot.add_first_layers(row, net, 2)
    assert "first_layers" not in row and bench_plot.first_layers_text([row]) == ""


def test_layers_panel_without_layer_times_says_so():
    import matplotlib.pyplot as plt

    mode = {"layer_seconds": None, "live_rows_per_layer": [50, 20],
            "computed_rows_per_layer": [60, 50]}
    row = {"neurons": 1024, "layers": 2, "backend": "reference", "modes": {"off": mode}}
    fig, ax = plt.subplots()
    bench_plot._layers_panel(ax, row)
    assert "live rows per layer only" in ax.get_title()
    assert "no per-layer timer" in ax.get_title()
    np.testing.assert_array_equal(ax.get_lines()[0].get_ydata(), [60, 50])
    plt.close(fig)


def _is_png(path) -> bool:
    import matplotlib.image

    data = path.read_bytes()
    return data[:8] == PNG_MAGIC and matplotlib.image.imread(path).shape[0] > 100


def test_bench_plot_end_to_end_cpu(tmp_path, capsys):
    png, js = tmp_path / "b.png", tmp_path / "b.json"
    assert main(["bench", "--config", "1024x6", "--config", "1024x4", "--images", "200",
                 "--data-dir", str(tmp_path), "--backend", "cpu", "--repeat", "1",
                 "--first-layers", "3", "--plot", str(png), "--plot-config", "1024x4",
                 "--json", str(js), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "first 3 layers of 1024x6, off (direct), backend cpu" in out and "%floor" in out
    assert _is_png(png)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.png")]
    results = json.loads(js.read_text())["results"]
    for r in results:
        for mode in r["modes"].values():
            assert len(mode["layer_seconds"]) == r["layers"]
            assert all(s > 0 for s in mode["layer_seconds"])
        fl = r["first_layers"]
        assert fl["mode"] == "off" and len(fl["rows"]) == 3 and fl["all"]["layers"] == r["layers"]
        assert fl["rows"][0]["rows_in"] == r["modes"]["off"]["computed_rows_per_layer"][0]


def test_bench_plot_reference_backend_has_no_layer_times(tmp_path, capsys):
    png, js = tmp_path / "r.png", tmp_path / "r.json"
    assert main(["bench", "--config", "1024x3", "--images", "100", "--data-dir",
                 str(tmp_path), "--backend", "reference", "--repeat", "1",
                 "--plot", str(png), "--json", str(js), "--quiet"]) == 0
    assert "first 3 layers" not in capsys.readouterr().out
    assert _is_png(png)
    res = json.loads(js.read_text())["results"][0]
    assert res["modes"]["off"]["layer_seconds"] is None and "first_layers" not in res


def test_bad_plot_config_exits_2_before_anything_runs(tmp_path, capsys):
    png = tmp_path / "b.png"
    assert main(["bench", "--config", "1024x6", "--images", "200", "--data-dir",
                 str(tmp_path), "--backend", "cpu", "--plot", str(png),
                 "--plot-config", "2048x6", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--plot-config 2048x6" in err and "1024x6" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no PNG, no generated store
    assert main(["bench", "--config", "1024x6", "--data-dir", str(tmp_path),
                 "--plot-config", "1024x6", "--quiet"]) == 2
    assert "--plot-config needs --plot" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse's own error
        main(["bench", "--config", "1024x6", "--plot-config", "bad", "--quiet"])
    assert exc.value.code == 2
    assert "--plot-config" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
