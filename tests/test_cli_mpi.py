"""`spdnn infer` under mpiexec: same files for every rank count; failures stop all ranks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import random_inputs, random_network, set_layer_item

from spdnn_mpi.formats.store.reader import StoreWriter
from spdnn_mpi.reference import reference_categories


def write_store(path, seed=21, n_images=301):
    rng = np.random.default_rng(seed)
    net = random_network(rng, [48] * 5, 0.2, uniform=True)
    rows = random_inputs(rng, n_images, 48, 0.25)
    with StoreWriter(path) as w:
        for layer in net.layers:
            w.add_layer(layer)
        w.write_inputs(rows)
        w.add_truth(4, reference_categories(net, rows), "reference")
    return reference_categories(net, rows)


@pytest.mark.mpi
def test_cli_under_mpi_writes_checked_categories(tmp_path_factory):
    from mpi4py import MPI

    from spdnn_mpi.cli import main

    comm = MPI.COMM_WORLD
    d = comm.bcast(str(tmp_path_factory.mktemp("cli")) if comm.rank == 0 else None)
    expected = write_store(f"{d}/s.h5") if comm.rank == 0 else None
    comm.Barrier()
    status = main(["infer", f"{d}/s.h5", "--backend", "cpu", "--threads", "1", "--check",
                   "--out", f"{d}/c.tsv", "--json", f"{d}/r.json", "--quiet",
                   "--partition", "nnz"])
    assert status == 0
    if comm.rank == 0:
        np.testing.assert_array_equal(np.loadtxt(f"{d}/c.tsv", dtype=np.int64), expected)
        assert os.path.exists(f"{d}/r.json")


def _mpiexec() -> str:
    exe = os.environ.get("MPIEXEC") or shutil.which("mpiexec")
    if not exe:
        pytest.skip("no mpiexec on PATH (install the mpich extra)")
    return exe


def test_one_rank_with_a_bad_path_stops_everyone_quickly(tmp_path):
    """MPMD launch: ranks 0-1 get a good store, rank 2 a missing one."""
    mpiexec = _mpiexec()
    write_store(tmp_path / "good.h5")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-m", "spdnn_mpi", "infer", "--backend", "cpu", "--threads", "1",
           "--quiet", "--out", str(tmp_path / "c.tsv")]
    argv = [mpiexec, "-n", "2", *cmd, str(tmp_path / "good.h5"), ":",
            "-n", "1", *cmd, str(tmp_path / "missing.h5")]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr  # one message, not one per rank
    assert "rank 2 of 3" in errors[0] and "missing.h5" in errors[0]
    assert not (tmp_path / "c.tsv").exists()
    assert elapsed < 60


@pytest.mark.parametrize("bad", [[0], [0, 1, 2]], ids=["rank0", "every-rank"])
def test_failure_is_printed_once_by_the_first_failing_rank(tmp_path, bad):
    """Before: every rank printed the same line labelled 'rank 0 of 3'."""
    mpiexec = _mpiexec()
    write_store(tmp_path / "good.h5")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-m", "spdnn_mpi", "infer", "--backend", "cpu", "--threads", "1",
           "--quiet"]
    argv = [mpiexec]
    for rank in range(3):
        store = tmp_path / ("missing.h5" if rank in bad else "good.h5")
        argv += [*([":"] if rank else []), "-n", "1", *cmd, str(store)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("spdnn infer: error: rank 0 of 3: ")
    if len(bad) == 3:
        assert "(also failed: rank(s) 1, 2, same error)" in errors[0]
    else:
        assert "also failed" not in errors[0]


def test_check_failure_gives_nonzero_exit_on_every_rank(tmp_path):
    import h5py

    mpiexec = _mpiexec()
    write_store(tmp_path / "s.h5")
    with h5py.File(tmp_path / "s.h5", "r+") as f:
        t = f["truth/l4"][()]
        del f["truth/l4"]
        f["truth"].create_dataset("l4", data=t[1:]).attrs["n_layers"] = 4
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "spdnn_mpi", "infer",
                           str(tmp_path / "s.h5"), "--check", "--backend", "cpu",
                           "--threads", "1", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "FAILED" in proc.stdout


@pytest.mark.parametrize("what", ["layers", "store", "partition"])
def test_ranks_that_disagree_stop_quickly(tmp_path, what):
    """MPMD launch with different arguments per rank: a clear message, not a hang."""
    mpiexec = _mpiexec()
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    write_store(a)
    write_store(b, seed=22)
    first, second, message = {
        "layers": ([a, "--layers", "4"], [a, "--layers", "3"],
                   "ranks disagree on --layers: rank 0 has --layers 4, rank 1 has --layers 3"),
        "store": ([a], [b], f"ranks disagree on store: rank 0 has {a} ("),
        "partition": ([a], [a, "--partition", "nnz"], "ranks disagree on --partition"),
    }[what]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-m", "spdnn_mpi", "infer", "--backend", "cpu", "--threads", "1",
           "--quiet", "--out", str(tmp_path / "c.tsv")]
    t0 = time.monotonic()
    proc = subprocess.run([mpiexec, "-n", "1", *cmd, *first, ":", "-n", "1", *cmd, *second],
                          capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert proc.stderr.count("error:") == 1, proc.stderr  # printed once, by rank 0
    assert "Traceback" not in proc.stderr and not (tmp_path / "c.tsv").exists()
    assert elapsed < 60


def test_copies_of_one_store_agree(tmp_path):
    """Node-local copies of a store have other paths but the same identity."""
    mpiexec = _mpiexec()
    expected = write_store(tmp_path / "a.h5")
    shutil.copy(tmp_path / "a.h5", tmp_path / "copy.h5")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-m", "spdnn_mpi", "infer", "--backend", "cpu", "--threads", "1",
           "--quiet", "--check", "--out", str(tmp_path / "c.tsv")]
    proc = subprocess.run([mpiexec, "-n", "1", *cmd, str(tmp_path / "a.h5"), ":",
                           "-n", "1", *cmd, str(tmp_path / "copy.h5")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "c.tsv", dtype=np.int64), expected)


def _damage(path, what: str) -> None:
    """One out-of-range entry: in the last layer's weights, rank 0's inputs, or the truth."""
    import h5py

    with h5py.File(path, "r+") as f:
        if what == "weights":
            set_layer_item(f, 4, "indices", 3, 48)  # the layers are 48 wide
        elif what == "inputs":
            f["inputs/indices"][0] = 48
        else:
            f["truth/l4"][0] = 10**6  # beyond the 301 images


@pytest.mark.parametrize("load", ["node", "rank"])
@pytest.mark.parametrize("what", ["weights", "inputs", "truth"])
def test_a_damaged_store_ends_every_rank_with_one_message(tmp_path, what, load):
    """Before: with --weights-load node the reading rank raised before the weights'
    broadcast while the others waited in it, and every rank hung."""
    mpiexec = _mpiexec()
    write_store(tmp_path / "s.h5")
    _damage(tmp_path / "s.h5", what)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for ranks in (2, 3):
        t0 = time.monotonic()
        proc = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "spdnn_mpi",
                               "infer", str(tmp_path / "s.h5"), "--backend", "cpu",
                               "--threads", "1", "--quiet", "--check", "--weights-load", load],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and "s.h5" in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr
        assert time.monotonic() - t0 < 30


def test_ranks_running_different_subcommands_stop(tmp_path):
    """An MPMD launch with `infer` on one rank and `info` on the other: before, rank 0
    waited forever for a rank that never joined."""
    mpiexec = _mpiexec()
    write_store(tmp_path / "s.h5")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    spdnn = [sys.executable, "-m", "spdnn_mpi"]
    proc = subprocess.run([mpiexec, "-n", "1", *spdnn, "infer", str(tmp_path / "s.h5"),
                           "--backend", "cpu", "--quiet", ":", "-n", "1", *spdnn, "info",
                           str(tmp_path / "s.h5")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    assert "rank 0 runs `spdnn infer`, rank 1 runs `spdnn info`" in errors[0]


def _rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the process of ``rank`` whose command line holds ``marker``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() not in fh.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = dict(v.split(b"=", 1) for v in fh.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        for name in (b"PMI_RANK", b"OMPI_COMM_WORLD_RANK", b"PMIX_RANK"):
            if env.get(name) == str(rank).encode():
                return int(entry)
    return None


def test_a_rank_stopped_by_sigterm_says_which_rank(tmp_path):
    """Every rank ended at once when one was stopped, but nothing said which or how."""
    import signal

    mpiexec = _mpiexec()
    out = tmp_path / "deep.h5"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "spdnn_mpi", "generate",
                             "--neurons", "64", "--layers", "400000", "--images", "100",
                             "--truth-backend", "none", "--quiet", "--out", str(out)],
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    pid = None
    while pid is None and time.monotonic() < deadline and proc.poll() is None:
        pid = _rank_pid(str(out), 1)
        time.sleep(0.2)
    assert pid is not None, "rank 1 not found"
    time.sleep(1.0)  # past start-up, inside the layers
    os.kill(pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "spdnn generate: rank 1 of 2: terminated" in err, err
