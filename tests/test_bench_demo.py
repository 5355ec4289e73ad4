"""`spdnn bench` (table, JSON, peers, simulated ranks) and `spdnn demo` on small data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spdnn_mpi.bench.peers.graphblas import graphblas_infer
from spdnn_mpi.cli import main
from spdnn_mpi.formats.store.reader import Store


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "s.h5"
    assert main(["generate", "--neurons", "1024", "--layers", "12", "--images", "400",
                 "--seed", "3", "--out", str(path), "--quiet"]) == 0
    return path


def test_cpu_kernels_cost_is_apart_from_the_layout_in_a_new_process(tiny_store, tmp_path):
    """In a process that has not imported numba yet: the kernels' cost is reported apart
    from the layout and inside the time the layout took (numba's import is neither)."""
    import subprocess
    import sys

    out = tmp_path / "b.json"
    run = subprocess.run([sys.executable, "-m", "spdnn_mpi", "bench", str(tiny_store),
                          "--backend", "cpu", "--compress", "off", "--repeat", "1",
                          "--json", str(out), "--quiet"], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    res = json.loads(out.read_text())["results"][0]
    assert res["read_seconds"] > 0 and res["layout_seconds"] >= 0
    assert res["compile_seconds"] > 0 and res["kernels_compiled"] in (True, False)


def test_bench_store_with_graphblas_peer_and_simulated_ranks(tiny_store, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", str(tiny_store), "--backend", "cpu", "--peer", "graphblas",
                 "--ranks-sim", "3,2", "--repeat", "2", "--json", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "graphblas_s" in table and "auto_proj_x" in table and "pass" in table
    # a CPU run: its comparison is the GraphBLAS peer, not the published GPU figures
    assert "SNICIT" not in table and "A100" not in table and "floor" not in table
    sims = _section(table, "simulated ranks")
    assert [(line.split()[0], line.split()[2]) for line in sims] == [("1024", "3"), ("1024", "2")]
    res = json.loads(out.read_text())["results"][0]
    assert "anchors" not in res and "first_layers" not in res
    assert res["neurons"] == 1024 and res["layers"] == 12
    assert res["peers"]["graphblas"]["agrees"]
    off, auto = res["modes"]["off"], res["modes"]["auto"]
    assert len(off["seconds_all"]) == len(auto["seconds_all"]) == 2
    assert off["check"]["passed"] and auto["check"]["passed"] and auto["same_as_off"]
    assert off["check"]["against"].startswith("truth")
    assert all(e["representatives"] <= e["rows"] for e in auto["compression"])
    assert auto["end_to_end_seconds"] > auto["seconds"] > 0
    assert auto["computed_edges_per_second"] < auto["edges_per_second"]
    for mode in (off, auto):
        sim = mode["ranks_sim"]
        assert len(sim["seconds"]) == 3 and sim["imbalance"] >= 1.0
        assert [s["ranks"] for s in mode["ranks_sim_all"]] == [3, 2]
        assert mode["seconds_min"] == min(mode["seconds_all"])
        assert mode["seconds_max"] == max(mode["seconds_all"])
        assert mode["seconds_min"] <= mode["seconds"] <= mode["seconds_max"]
    for p, line in zip((3, 2), sims):  # every P asked for, both modes' projections
        cells = line.split()
        for mode, col in ((off, 3), (auto, 6)):
            sim = next(s for s in mode["ranks_sim_all"] if s["ranks"] == p)
            assert float(cells[col]) == pytest.approx(sim["projected_speedup"], abs=6e-4)
            assert float(cells[col + 1]) == pytest.approx(sim["imbalance"], abs=6e-4)
    conv = res["converged_layers"]
    assert conv["rows_at_most"] == 32 and conv["mode"] == "auto"
    assert "converged layers, auto (compressed)" in table and "1024x12:" in table
    assert "off_runs_s" in table and "auto_runs_s" in table
    for mode in (off, auto):  # both modes' spreads, so an outlier of either shows
        assert f"{mode['seconds_min']:.3f}-{mode['seconds_max']:.3f}" in table
    whole = json.loads(out.read_text())
    assert whole["peak_host_bytes"] >= res["peak_host_bytes"] > 10_000_000


def _section(text: str, title: str) -> list[str]:
    """The data lines of the table printed under the line that starts with ``title``."""
    lines = text.split("\n" + title, 1)[1].splitlines()[1:]
    body = lines[2:]  # after the header and its rule
    return body[:next((i for i, line in enumerate(body) if not line.strip()[:1].isdigit()),
                      len(body))]


def test_bench_one_mode_only(tiny_store, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", str(tiny_store), "--backend", "cpu", "--compress", "off",
                 "--repeat", "1", "--json", str(out), "--quiet"]) == 0
    assert list(json.loads(out.read_text())["results"][0]["modes"]) == ["off"]


def test_bench_peer_shows_progress_unless_quiet(tiny_store, capsys):
    assert main(["bench", str(tiny_store), "--backend", "cpu", "--peer", "graphblas",
                 "--repeat", "1", "--compress", "off"]) == 0
    err = capsys.readouterr().err
    assert "peer graphblas: layer 12/12" in err and "layers/s" in err


def test_graphblas_peer_matches_truth(tiny_store):
    with Store(tiny_store) as st:
        net, rows, truth = st.network(), st.inputs(), st.truth(12)
    ids, seconds = graphblas_infer(net, rows, threads=1)
    np.testing.assert_array_equal(ids + 1, truth)
    assert seconds > 0


def test_bench_generated_config(tmp_path, capsys):
    assert main(["bench", "--config", "1024x6", "--images", "200", "--data-dir",
                 str(tmp_path), "--backend", "cpu", "--repeat", "1", "--quiet"]) == 0
    assert "1024" in capsys.readouterr().out
    assert list(tmp_path.glob("radixnet-n1024-l6-*.h5"))


def test_bench_keeps_the_cases_done_when_a_later_store_cannot_be_made(tmp_path, monkeypatch,
                                                                      capsys):
    """Each N's store is generated just before its cases: a run stopped at the next N
    (here its generation fails; on a device machine, a time limit) keeps its results."""
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.generators import challenge

    made = []
    real = challenge.generate_store

    def generate_store(path, n, *args, **kwargs):
        made.append(n)
        if n == 4096:
            raise SpdnnError("no room for the 4096 store")
        return real(path, n, *args, **kwargs)

    monkeypatch.setattr(challenge, "generate_store", generate_store)
    out = tmp_path / "b.json"
    assert main(["bench", "--config", "1024x4", "--config", "4096x4", "--config", "1024x6",
                 "--images", "200", "--data-dir", str(tmp_path), "--backend", "cpu",
                 "--repeat", "1", "--json", str(out), "--quiet"]) == 2
    assert "no room for the 4096 store" in capsys.readouterr().err
    assert made == [1024, 4096]
    done = json.loads(out.read_text())["results"]
    assert [(r["neurons"], r["layers"]) for r in done] == [(1024, 4), (1024, 6)]
    assert all(r["modes"]["off"]["check"]["passed"] for r in done)


def test_bench_needs_something_to_do(capsys):
    assert main(["bench", "--quiet"]) == 2
    assert "nothing to benchmark" in capsys.readouterr().err


def test_demo_generates_once_then_reuses(tmp_path, capsys):
    argv = ["demo", "--images", "300", "--cache-dir", str(tmp_path), "--backend", "cpu"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "PASSED" in first.out and "generating" in first.err
    assert main(argv) == 0
    second = capsys.readouterr()
    assert "PASSED" in second.out and "using cached" in second.err


def test_bench_uses_the_store_demo_made(tmp_path, monkeypatch, capsys):
    """One cache folder and one finder for both: bench --config 1024x120 runs on the
    store demo generated (same N, L, images, seed), without generating it again."""
    from spdnn_mpi.generators import challenge

    assert main(["demo", "--images", "200", "--cache-dir", str(tmp_path), "--backend", "cpu",
                 "--quiet"]) == 0
    (made,) = tmp_path.glob("*.h5")
    before = made.stat().st_mtime_ns

    def generate_store(*args, **kwargs):
        raise AssertionError("the store demo made was generated again")

    monkeypatch.setattr(challenge, "generate_store", generate_store)
    out = tmp_path / "b.json"
    assert main(["bench", "--config", "1024x120", "--images", "200", "--data-dir",
                 str(tmp_path), "--backend", "cpu", "--repeat", "1", "--compress", "off",
                 "--json", str(out)]) == 0
    assert f"using cached {made}" in capsys.readouterr().err
    (res,) = json.loads(out.read_text())["results"]
    assert res["store"] == str(made) and res["modes"]["off"]["check"]["passed"]
    assert made.stat().st_mtime_ns == before


def test_demo_runs_its_120_layers_of_a_deeper_cached_store(tmp_path, capsys):
    from spdnn_mpi.generators.challenge import cached_generated_store

    deep = cached_generated_store(tmp_path, 1024, 130, 200, 1, [120, 130])
    out = tmp_path / "r.json"
    assert main(["demo", "--images", "200", "--cache-dir", str(tmp_path), "--backend", "cpu",
                 "--json", str(out)]) == 0
    assert f"using cached {deep}" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["n_layers"] == 120 and report["check"]["passed"]


def test_a_deeper_cached_store_with_the_truth_serves(tmp_path):
    from spdnn_mpi.generators.challenge import (
        find_generated_store,
        generate_store,
        generated_store_name,
    )

    path = tmp_path / generated_store_name(64, 6, 50, 2)
    generate_store(path, 64, 6, 2, images=50, truth_layers=[3, 6])
    (tmp_path / generated_store_name(64, 4, 50, 2)).write_text("not a store")  # skipped
    assert find_generated_store(tmp_path, 64, 4, 50, 2, [3]) == path
    assert find_generated_store(tmp_path, 64, 6, 50, 2, [3, 6]) == path
    for request in ((64, 7, 50, 2, []), (64, 4, 50, 2, [4]), (64, 4, 51, 2, []),
                    (64, 4, 50, 3, []), (256, 4, 50, 2, [])):
        assert find_generated_store(tmp_path, *request) is None, request


def test_a_cached_store_made_again_keeps_its_truth(tmp_path):
    from spdnn_mpi.formats.store.reader import Store
    from spdnn_mpi.generators.challenge import cached_generated_store, generate_store

    lines = []
    first = cached_generated_store(tmp_path, 64, 6, 50, 2, [6], log=lines.append)
    assert lines[0].startswith(f"generating {first}") and lines[1].startswith("generated")
    again = cached_generated_store(tmp_path, 64, 6, 50, 2, [3], log=lines.append)
    assert again == first and lines[2].startswith(f"generating {first}")
    with Store(again) as st:
        assert st.truth_layers() == [3, 6]
    generate_store(tmp_path / "x.h5", 64, 6, 2, images=50, truth_layers=[3])
    with Store(tmp_path / "x.h5") as fresh, Store(again) as cached:
        np.testing.assert_array_equal(fresh.truth(3), cached.truth(3))
    assert cached_generated_store(tmp_path, 64, 5, 50, 2, [3, 6], log=lines.append) == first
    assert lines[-1] == f"using cached {first}"


def test_bench_refuses_zero_layers_and_a_json_over_its_store(tiny_store, capsys):
    assert main(["bench", str(tiny_store), "--layers", "0", "--quiet", "--repeat", "1"]) == 2
    assert "0 layers asked for, store has 12" in capsys.readouterr().err
    before = tiny_store.read_bytes()
    assert main(["bench", str(tiny_store), "--json", str(tiny_store), "--quiet"]) == 2
    assert "refusing to write over an input" in capsys.readouterr().err
    assert tiny_store.read_bytes() == before


def _bench_row(off_check, auto_check):
    mode = {"teraedges_per_second": 1.0, "computed_teraedges_per_second": 1.0,
            "seconds_min": 1.0, "seconds_max": 1.0, "end_to_end_seconds": 2.0,
            "alive_at_end": 5}
    return {"neurons": 1024, "layers": 120,
            "anchors": {"paper_2020_a100": 16.74, "snicit_a6000": 17.6}, "peers": {},
            "modes": {"off": {**mode, "check": off_check},
                      "auto": {**mode, "check": auto_check, "same_as_off": True}}}


@pytest.mark.parametrize("off_check, auto_check, shown", [
    ({"against": "truth (reference)", "passed": True},
     {"against": "truth (reference)", "passed": True}, "pass"),
    ({"against": "peer cusparse", "passed": True}, {"against": "off", "passed": True}, "pass"),
    (None, {"against": "off", "passed": True}, "auto=off"),  # nothing independent
    (None, {"against": "off", "passed": False}, "FAIL"),
    (None, None, "-"),
])
def test_bench_table_says_what_the_categories_were_checked_against(off_check, auto_check,
                                                                    shown):
    from spdnn_mpi.bench.tables import table

    line = table([_bench_row(off_check, auto_check)], []).splitlines()[2]
    assert line.split()[-1] == shown


def test_gpu_table_shows_the_anchors_and_a_cpu_table_does_not():
    from spdnn_mpi.bench.tables import table

    row = _bench_row(None, None)
    gpu = table([row], [])
    assert "A100_2020" in gpu.splitlines()[0] and "SNICIT" in gpu.splitlines()[0]
    assert "16.740" in gpu and "published TE/s" in gpu
    del row["anchors"]
    cpu = table([row], [])
    assert "A100" not in cpu and "SNICIT" not in cpu and "16.740" not in cpu


@pytest.mark.parametrize("device, card", [("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
                                          ("NVIDIA H200", "NVIDIA H200"),
                                          ("NVIDIA L4", None)])
def test_a_gpu_run_gets_the_floor_of_its_card(tiny_store, device, card, capsys):
    """bench_case as on a GPU (the CPU backend reporting a device name): anchors, the
    first layers against that card's floor, or none for a card not in the table."""
    from spdnn_mpi.backends import make_backend
    from spdnn_mpi.bench.challenge import bench_case
    from spdnn_mpi.bench.tables import report
    from spdnn_mpi.cli import build_parser

    args = build_parser().parse_args(["bench", str(tiny_store), "--repeat", "1", "--quiet",
                                      "--first-layers", "4"])
    backend = make_backend("cpu", threads=1)
    describe = backend.describe
    backend.describe = lambda: {**describe(), "device": device, "compile_seconds": 0.25,
                                "kernels_compiled": True}
    row = bench_case(args, tiny_store, None, backend, "cuda")
    fl = row["first_layers"]
    assert row["compile_seconds"] == 0.25 and row["kernels_compiled"] is True
    assert row["anchors"] == {"paper_2020_a100": None, "snicit_a6000": None}
    assert fl["device"] == device and fl["card"] == card and len(fl["rows"]) == 4
    text = report([row], [])
    assert "A100_2020" in text and "compile_s" in text and "0.250*" in text
    if card is None:
        assert fl["ceilings"] is None and all(r["floor_us"] is None for r in fl["rows"])
        assert f"no floor: the device {device!r} is not in the card table" in text
    else:
        assert fl["ceilings"]["card"] == card and fl["rows"][0]["floor_us"] > 0
        assert f"floor: one {card}," in text and f"backend cuda, {card}:" in text


@pytest.mark.parametrize("argv, option", [
    (["--config", "64x0"], "--config"),
    (["--config", "0x120"], "--config"),
    (["--config", "64x-1"], "--config"),
    (["--plot-config", "1024x0"], "--plot-config"),
    (["--peer-max", "0x1"], "--peer-max"),
    (["--repeat", "0"], "--repeat"),
    (["--repeat", "-1"], "--repeat"),
    (["--threads", "0"], "--threads"),
    (["--first-layers", "-1"], "--first-layers"),
    (["--images", "0"], "--images"),
    (["--model-images", "0"], "--model-images"),
    (["--batch", "0"], "--batch"),
    (["--repeat", "two"], "--repeat"),
])
def test_bench_refuses_bad_counts_at_parse_time(argv, option, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--config", "1024x2", *argv, "--quiet"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and argv[1] in err and "Traceback" not in err


def test_bench_parses_first_layers_zero_as_none():
    from spdnn_mpi.cli import build_parser

    args = build_parser().parse_args(["bench", "--config", "1024x2", "--first-layers", "0"])
    assert args.first_layers == 0
