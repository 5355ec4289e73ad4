"""Floors per card, the first-layers table and `spdnn bench --plot` on tiny configurations."""

from __future__ import annotations

import json
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest

from spdnn_mpi.bench import plot as bench_plot
from spdnn_mpi.bench import tables
from spdnn_mpi.bench.floors import (
    CARDS,
    H100_SXM,
    H200,
    add_first_layers,
    card_for,
    converged_layers,
    first_layers,
    layer_floor,
)
from spdnn_mpi.cli import main

matplotlib.use("Agg")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_hbm_bound_layer_by_hand():
    # 1024 -> 1024, 32 per output, 60000 rows: 4 * 60000 * 2048 B of features
    # (491 520 000) + 2 B * 32768 indices = 491 585 536 B; 32 * 1024 * 60000 FMAs.
    fl = layer_floor(1024, 1024, 32, 60000, H200)
    assert fl["bytes"] == 491_585_536 and fl["fmas"] == 1_966_080_000
    assert fl["bound"] == "hbm"
    assert fl["seconds"] == pytest.approx(491_585_536 / 4.3e12)  # 114.3 us
    assert fl["fma_seconds"] == pytest.approx(1_966_080_000 / 33.45408e12)  # 58.8 us


def test_fma_bound_layer_by_hand():
    # dense 1024 x 1024, 1000 rows: 8 192 000 + 2 097 152 B, 1.048576e9 FMAs
    fl = layer_floor(1024, 1024, 1024, 1000, H200)
    assert fl["bytes"] == 10_289_152 and fl["fmas"] == 1_048_576_000
    assert fl["bound"] == "fma"
    assert fl["seconds"] == pytest.approx(1_048_576_000 / 33.45408e12)  # 31.3 us
    assert fl["hbm_seconds"] == pytest.approx(10_289_152 / 4.3e12)  # 2.4 us
    assert H200.hbm_bytes_per_s == 4.3e12 and H200.fma_per_s == pytest.approx(33.45408e12)


@pytest.mark.parametrize("device, card", [
    ("NVIDIA H200", H200),
    ("NVIDIA H100 80GB HBM3", H100_SXM),
    ("nvidia h100 80gb hbm3 ", H100_SXM),
    ("NVIDIA H100 PCIe", None),  # other SMs and memory: no floor, not the SXM one
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA A100-SXM4-80GB", None),
    ("", None),
    (None, None),
])
def test_card_is_picked_from_the_device_name(device, card):
    assert card_for(device) is card


def test_h100_floor_uses_the_h100_bandwidth():
    h100 = layer_floor(1024, 1024, 32, 60000, H100_SXM)
    h200 = layer_floor(1024, 1024, 32, 60000, H200)
    assert h100["bytes"] == h200["bytes"] == 491_585_536
    assert h100["seconds"] == pytest.approx(491_585_536 / 3.0e12)  # 163.9 us
    assert h200["seconds"] == pytest.approx(491_585_536 / 4.3e12)  # 114.3 us
    assert H100_SXM.fma_per_s == pytest.approx(132 * 128 * 1.98e9)
    assert {c.name for c in CARDS} >= {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}


def _layer(n_in, n_out, degree, values=None):
    return SimpleNamespace(n_in=n_in, n_out=n_out, nnz=degree * n_out, values=values)


def test_first_layers_rows_and_totals_from_a_fake_result():
    net = SimpleNamespace(layers=[_layer(1024, 1024, 32)] * 3 + [_layer(1024, 1024, 1024)])
    rows_in = [60000, 30000, 1000, 1000]
    seconds = [228.6e-6, 200e-6, 10e-6, 62.7e-6]
    out = first_layers(net, rows_in, seconds, 2, H200)
    floors = [layer_floor(1024, 1024, 32, r, H200)["seconds"] for r in rows_in[:3]]
    floors.append(layer_floor(1024, 1024, 1024, 1000, H200)["seconds"])
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
    assert out["ceilings"] == {"card": "NVIDIA H200", "hbm_bytes_per_s": 4.3e12,
                               "fma_per_s": H200.fma_per_s}
    unknown = first_layers(net, rows_in, seconds, 2, None)
    assert unknown["ceilings"] is None and unknown["rows"][0]["floor_us"] is None
    assert unknown["rows"][0]["measured_us"] == pytest.approx(228.6)
    assert unknown["rows"][0]["percent_of_floor"] is None and unknown["all"]["floor_us"] is None
    untimed = first_layers(net, rows_in, None, 10, H200)
    assert untimed["k"] == 4 and untimed["rows"][3]["bound"] == "fma"
    assert untimed["rows"][0]["percent_of_floor"] is None
    assert untimed["all"]["measured_us"] is None


def test_a_first_layer_reading_bits_has_a_floor_of_an_eighth_byte_an_input():
    """Binary inputs read as bits: layer 1 reads n_in / 8 bytes a row, not 4 n_in; the
    later layers' floors are as before, and the table's legend says so."""
    # 65536 -> 65536, 32 an output, 60000 rows: 60000 x (65536 / 8 + 4 x 65536) B of
    # features + 2 B x 2097152 indices
    fl = layer_floor(65536, 65536, 32, 60000, H100_SXM, input_bytes=1 / 8)
    assert fl["bytes"] == 60000 * (8192 + 262144) + 4_194_304
    net = SimpleNamespace(layers=[_layer(1024, 1024, 32)] * 3)
    row = _gpu_row()
    add_first_layers(row, net, 3, H200, H200.name, input_bits=True)
    floors = row["first_layers"]["floor_us_per_layer"]
    assert floors[0] == pytest.approx(
        1e6 * layer_floor(1024, 1024, 32, 60000, H200, input_bytes=1 / 8)["seconds"])
    assert floors[1] == pytest.approx(1e6 * layer_floor(1024, 1024, 32, 20000, H200)["seconds"])
    assert row["first_layers"]["input_bits"] is True
    assert "Layer 1 read its binary inputs as bits" in tables.first_layers_text([row])
    plain = _gpu_row()
    add_first_layers(plain, net, 3, H200, H200.name)
    assert plain["first_layers"]["floor_us_per_layer"][0] > floors[0]
    assert "as bits" not in tables.first_layers_text([plain])


def test_the_one_pass_floor_reads_the_rows_of_the_layer_before():
    """A layer that ends rows still writes them, so the next one reads them: layer k's
    one-pass floor reads layer k - 1's rows_in and writes its own; the first layer's is
    its floor."""
    net = SimpleNamespace(layers=[_layer(1024, 1024, 32)] * 3)
    rows_in, seconds = [60000, 20000, 3000], [2e-4, 1e-4, 1e-5]
    out = first_layers(net, rows_in, seconds, 3, H100_SXM)
    first, second, third = out["rows"]
    assert first["one_pass_floor_us"] == pytest.approx(first["floor_us"])
    two = layer_floor(1024, 1024, 32, 20000, H100_SXM, read_rows=60000)
    # 60000 rows read, 20000 written, 4 B x 1024 each, + 2 B x 32768 indices
    assert two["bytes"] == (60000 + 20000) * 4096 + 65536
    assert second["one_pass_floor_us"] == pytest.approx(1e6 * two["seconds"])
    assert second["percent_of_one_pass_floor"] == pytest.approx(100 * two["seconds"] / 1e-4)
    assert third["percent_of_one_pass_floor"] > third["percent_of_floor"]
    one_pass = [first, second, third]
    assert out["all"]["one_pass_floor_us"] == pytest.approx(
        sum(r["one_pass_floor_us"] for r in one_pass))
    assert out["all"]["percent_of_one_pass_floor"] == pytest.approx(
        100 * sum(r["one_pass_floor_us"] for r in one_pass) / (1e6 * sum(seconds)))
    text = tables.first_layers_text([{"neurons": 1024, "layers": 3, "backend": "cuda",
                                      "first_layers": {**out, "card": H100_SXM.name,
                                                       "device": H100_SXM.name}}])
    assert "%1pass" in text and "one-pass floor" in text
    assert out["floor_us_per_layer"] == pytest.approx([r["floor_us"] for r in one_pass])
    bits = first_layers(net, rows_in, seconds, 3, H100_SXM, input_bits=True)["rows"]
    assert bits[0]["one_pass_floor_us"] == pytest.approx(bits[0]["floor_us"])  # bits read
    assert bits[1]["one_pass_floor_us"] == pytest.approx(second["one_pass_floor_us"])


def _gpu_row(net_layers: int = 3) -> dict:
    return {"neurons": 1024, "layers": net_layers, "backend": "cuda",
            "modes": {"off": {"layer_seconds": [2e-4, 1e-4, 1e-5],
                              "computed_rows_per_layer": [60000, 20000, 3000]}}}


@pytest.mark.parametrize("card, hbm", [(H200, "4.3e12"), (H100_SXM, "3.0e12")])
def test_first_layers_table_text_names_the_card_of_the_run(card, hbm):
    net = SimpleNamespace(layers=[_layer(1024, 1024, 32)] * 3)
    row = _gpu_row()
    add_first_layers(row, net, 2, card, card.name)
    text = tables.first_layers_text([row])
    assert f"first 2 layers of 1024x3, off (direct), backend cuda, {card.name}" in text
    assert "first 2" in text and "all 3" in text and "%floor" in text and "hbm" in text
    assert f"floor: one {card.name}, max(HBM bytes / {hbm} B/s" in text
    assert row["first_layers"]["ceilings"]["hbm_bytes_per_s"] == card.hbm_bytes_per_s
    assert row["first_layers"]["card"] == card.name
    assert len(row["first_layers"]["floor_us_per_layer"]) == 3
    row["modes"]["off"]["layer_seconds"] = None
    del row["first_layers"]
    add_first_layers(row, net, 2, card, card.name)
    assert "first_layers" not in row and tables.first_layers_text([row]) == ""


def test_unknown_card_gets_no_floor_and_the_legend_says_so():
    net = SimpleNamespace(layers=[_layer(1024, 1024, 32)] * 3)
    row = _gpu_row()
    add_first_layers(row, net, 3, card_for("NVIDIA A100-SXM4-80GB"), "NVIDIA A100-SXM4-80GB")
    fl = row["first_layers"]
    assert fl["card"] is None and fl["ceilings"] is None and fl["device"].startswith("NVIDIA A")
    assert "floor_us_per_layer" not in fl
    assert all(r["floor_us"] is None and r["measured_us"] for r in fl["rows"])
    text = tables.first_layers_text([row])
    assert "no floor for NVIDIA A100-SXM4-80GB" in text
    assert "no floor: the device 'NVIDIA A100-SXM4-80GB' is not in the card table" in text
    assert "H200" in text.split("card table", 1)[1]  # the cards that have one
    assert "floor: one" not in text and "hbm" not in text


def test_converged_layers_median_over_the_tail():
    mode = {"compress": "auto", "computed_rows_per_layer": [60000, 900, 32, 12, 40, 1, 1],
            "layer_seconds": [3e-4, 5e-5, 9e-6, 8e-6, 2e-5, 7e-6, 1.1e-5]}
    c = converged_layers(mode)
    assert c["layers"] == 4 and c["first_layer"] == 3 and c["rows_at_most"] == 32
    assert c["median_us"] == pytest.approx(8.5) and c["mode"] == "auto"
    assert c["min_us"] == pytest.approx(7.0) and c["max_us"] == pytest.approx(11.0)
    none = converged_layers({**mode, "computed_rows_per_layer": [60000] * 7})
    assert none["layers"] == 0 and none["median_us"] is None and none["first_layer"] is None
    assert converged_layers({**mode, "layer_seconds": None}) is None
    text = tables.converged_text([{"neurons": 1024, "layers": 7, "converged_layers": c},
                                  {"neurons": 4096, "layers": 7, "converged_layers": none}])
    assert "1024x7: 4 layers (from layer 3), median 8.5 us (fastest-slowest 7.0-11.0)" in text
    assert "4096x7: none (every layer computed more than 32 rows)" in text
    assert "at most 32 rows (one tile)" in text


def test_layers_panel_draws_the_floor_of_the_run_s_card():
    import matplotlib.pyplot as plt

    net = SimpleNamespace(layers=[_layer(1024, 1024, 32)] * 3)
    row = _gpu_row()
    row["modes"]["off"]["live_rows_per_layer"] = [20000, 3000, 3000]
    add_first_layers(row, net, 3, H100_SXM, H100_SXM.name)
    fig, ax = plt.subplots()
    bench_plot._layers_panel(ax, row)
    labels = [line.get_label() for line in ax.get_lines()]
    assert "NVIDIA H100 80GB HBM3 floor, off (HBM / FMA model)" in labels
    plt.close(fig)


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
    # a CPU run: no GPU floor, no GPU anchors; the converged layers line is there
    assert "first 3 layers" not in out and "%floor" not in out and "floor" not in out
    assert "A100" not in out and "SNICIT" not in out
    assert "converged layers, auto (compressed)" in out and "1024x6:" in out
    assert _is_png(png)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.png")]
    results = json.loads(js.read_text())["results"]
    for r in results:
        for mode in r["modes"].values():
            assert len(mode["layer_seconds"]) == r["layers"]
            assert all(s > 0 for s in mode["layer_seconds"])
        assert "first_layers" not in r and "anchors" not in r
        conv = r["converged_layers"]
        assert conv["mode"] == "auto" and conv["rows_at_most"] == 32
        rows = r["modes"]["auto"]["computed_rows_per_layer"]
        assert conv["layers"] == sum(1 for x in rows if x <= 32)


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
