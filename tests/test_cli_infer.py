"""`spdnn infer` end to end: outputs, report, --check, and errors (one process)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from conftest import write_random_store

from spdnn_mpi.cli import main
from spdnn_mpi.reference import reference_categories


@pytest.fixture
def small_store(tmp_path):
    path = tmp_path / "store.h5"
    net, rows = write_random_store(path, provenance={"test": True}, truth_layers=(2,))
    return path, reference_categories(net, rows), reference_categories(net.truncated(2), rows)


@pytest.mark.parametrize("backend", ["cpu", "reference", "auto"])
def test_infer_writes_categories_and_report(small_store, tmp_path, backend, capsys):
    path, expected, _ = small_store
    out, rep = tmp_path / "cats.tsv", tmp_path / "report.json"
    assert main(["infer", str(path), "--backend", backend, "--check", "--out", str(out),
                 "--json", str(rep), "--quiet"]) == 0
    got = np.loadtxt(out, dtype=np.int64, ndmin=1)
    np.testing.assert_array_equal(got, expected)
    report = json.loads(rep.read_text())
    assert report["check"]["passed"] and report["categories_count"] == len(expected)
    assert report["ranks"] == 1 and report["edges_per_second"] > 0
    assert len(report["live_rows_per_layer"]) == 4
    assert report["machine"]["hostname"]
    # where the time went, up to the file written: every phase, and the whole process
    phases = ("load_seconds", "layout_seconds", "compile_seconds", "warm_up_seconds",
              "input_seconds", "inference_seconds", "write_seconds")
    assert all(report[key] >= 0 for key in phases)
    # numba's kernels: compiled into an empty cache, else loaded from it; none for the reference
    assert report["kernels_compiled"] in ((False,) if backend == "reference" else (True, False))
    assert (report["compile_seconds"] > 0) == (backend != "reference")
    assert report["end_to_end_seconds"] >= sum(report[key] for key in phases)
    # and the rest: Python and the imports, finding the device, and what no phase holds
    rest = ("startup_seconds", "device_seconds", "other_seconds")
    assert report["startup_seconds"] > 0 and all(report[key] >= 0 for key in rest)
    assert sum(report[key] for key in phases + rest) == pytest.approx(
        report["end_to_end_seconds"], abs=1e-6)
    out = capsys.readouterr().out
    assert "PASSED" in out and "s before the command ran" in out


def test_infer_fewer_layers(small_store):
    path, _, expected2 = small_store
    assert main(["infer", str(path), "--layers", "2", "--check", "--quiet",
                 "--backend", "cpu"]) == 0
    assert len(expected2) > 0


def test_check_fails_loudly_on_altered_truth(small_store, tmp_path, capsys):
    path, expected, _ = small_store
    with h5py.File(path, "r+") as f:
        truth = f["truth/l4"][()]
        dead = int(np.setdiff1d(np.arange(1, 302), truth)[-1])  # an image that does not survive
        altered = np.sort(np.r_[truth[1:], [dead]])
        del f["truth/l4"]
        d = f["truth"].create_dataset("l4", data=altered)
        d.attrs["n_layers"] = 4
    rep = tmp_path / "r.json"
    assert main(["infer", str(path), "--check", "--quiet", "--backend", "cpu",
                 "--json", str(rep)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and str(int(expected[0])) in out and str(dead) in out
    assert json.loads(rep.read_text())["check"]["passed"] is False


def test_check_without_truth_is_an_error(small_store, capsys):
    path, _, _ = small_store
    assert main(["infer", str(path), "--layers", "3", "--check", "--quiet"]) == 2
    assert "no truth stored for 3 layers" in capsys.readouterr().err


def test_bad_arguments_name_the_problem(small_store, tmp_path, capsys):
    path, _, _ = small_store
    assert main(["infer", str(tmp_path / "missing.h5"), "--quiet"]) == 2
    assert "missing.h5" in capsys.readouterr().err
    assert main(["infer", str(path), "--layers", "9", "--quiet"]) == 2
    assert "--layers 9" in capsys.readouterr().err
    notstore = tmp_path / "x.h5"
    notstore.write_text("hello")
    assert main(["infer", str(notstore), "--quiet"]) == 2
    assert "not a readable HDF5 file" in capsys.readouterr().err


def test_batches_give_identical_categories(small_store, tmp_path):
    path, expected, _ = small_store
    out = tmp_path / "c.tsv"
    assert main(["infer", str(path), "--batch", "17", "--out", str(out), "--quiet",
                 "--backend", "cpu"]) == 0
    np.testing.assert_array_equal(np.loadtxt(out, dtype=np.int64), expected)


def test_python_dash_m_entry_point(small_store, tmp_path):
    """The process entry (which leaves the interpreter's last collection out) writes
    the same complete categories file as ``main`` in this process."""
    path, _, _ = small_store
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-m", "spdnn_mpi", "infer", str(path), "--check",
                           "--backend", "cpu", "--out", str(tmp_path / "a.tsv")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "check       PASSED" in proc.stdout and "layer" in proc.stderr
    assert main(["infer", str(path), "--backend", "cpu", "--quiet",
                 "--out", str(tmp_path / "b.tsv")]) == 0
    assert (tmp_path / "a.tsv").read_bytes() == (tmp_path / "b.tsv").read_bytes()


def test_the_process_entry_returns_the_status_and_leaves_objects_to_the_exit(monkeypatch):
    import spdnn_mpi.cli as cli

    monkeypatch.setattr(cli, "main", lambda: 3)
    try:
        assert cli.entry() == 3
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_text_report_has_live_rows_memory_and_machine(small_store, capsys):
    """The README says the text report gives live rows per layer, memory and the machine."""
    path, _, _ = small_store
    assert main(["infer", str(path), "--backend", "cpu", "--quiet", "--compress", "off"]) == 0
    out = capsys.readouterr().out
    live = next(line for line in out.splitlines() if line.startswith("live rows"))
    assert "after layer 1:" in live and "2:" in live and "4:" in live
    assert "memory      peak host" in out
    machine = next(line for line in out.splitlines() if line.startswith("machine"))
    assert "cores" in machine and "Python" in machine
    assert "per rank    " not in out  # one rank: no per-rank line
    assert main(["infer", str(path), "--backend", "cpu", "--quiet"]) == 0  # compress auto
    assert "rows        computed (representatives) after layer 1:" in capsys.readouterr().out


def test_report_json_has_peak_host_memory(small_store, tmp_path):
    path, _, _ = small_store
    rep = tmp_path / "r.json"
    assert main(["infer", str(path), "--backend", "cpu", "--quiet", "--json", str(rep)]) == 0
    report = json.loads(rep.read_text())
    assert report["peak_host_bytes"] > 10_000_000
    assert report["per_rank"][0]["peak_host_bytes"] == report["peak_host_bytes"]
    assert "peak_children_bytes" in report


def test_summary_lists_ranks_compactly():
    from spdnn_mpi.commands.infer import rank_line, sample_layers

    assert sample_layers(120) == [1, 2, 4, 8, 16, 32, 64, 120]
    assert sample_layers(1) == [1]
    ranks = [{"rank": r, "host": f"n{r // 4}", "images": 10, "inference_seconds": 1.0 + r}
             for r in range(3)]
    assert rank_line(ranks) == ("per rank    0: 1.0000 s (10 images), 1: 2.0000 s (10 images), "
                                "2: 3.0000 s (10 images); 1 host(s)")
    many = [dict(r, rank=k, inference_seconds=float(k)) for k, r in enumerate(ranks * 4)]
    line = rank_line(many)
    assert "min 0.0000 s" in line and "max 11.0000 s (rank 11)" in line


@pytest.mark.parametrize("command", [
    ["infer", "{store}", "--backend", "cuda", "--quiet"],
    ["bench", "{store}", "--backend", "cuda", "--quiet"],
])
def test_cuda_without_cupy_gives_the_install_hint(small_store, monkeypatch, capsys, command):
    path, _, _ = small_store
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy fails, as without CuPy
    assert main([c.format(store=path) for c in command]) == 2
    err = capsys.readouterr().err
    assert "pip install 'spdnn_mpi[cuda]'" in err, err
    assert "ModuleNotFoundError" not in err and "Traceback" not in err


def _spdnn(*argv, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.Popen([sys.executable, "-m", "spdnn_mpi.cli", *argv], env=env,
                            stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.parametrize("command", [["info"], ["infer", "--backend", "cpu", "--quiet"]])
def test_closed_stdout_pipe_exits_quietly(small_store, command):
    """`spdnn info s.h5 | head -1` with head gone: a BrokenPipeError traceback before.
    Now no message and status 141, as for a tool killed by SIGPIPE (what `set -o pipefail`
    scripts see from `cat big | head -1`)."""
    path, _, _ = small_store
    proc = _spdnn(command[0], str(path), *command[1:], stdout=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before anything is written
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (141, "")


def test_stdout_on_a_full_device_is_one_line(small_store):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path, _, _ = small_store
    with open("/dev/full", "w") as full:
        proc = _spdnn("info", str(path), stdout=full)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err == "spdnn info: error: cannot write standard output: No space left on device\n"
