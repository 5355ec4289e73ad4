"""Outputs: checked before the run, never over an input, failures in one line, no leftovers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import random_inputs, random_network, write_random_store

from spdnn_mpi.cli import main
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.formats.store.reader import Store
from spdnn_mpi.util.atomic import atomic_path, write_text_atomic


def make_store(path, seed=21, n_images=301):
    write_random_store(path, seed=seed, n_images=n_images)
    return path


def env_for_subprocess(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def test_infer_refuses_zero_layers_and_batch(tmp_path, capsys):
    store = make_store(tmp_path / "s.h5")
    assert main(["infer", str(store), "--layers", "0", "--quiet", "--backend", "cpu"]) == 2
    assert "--layers 0: must be at least 1" in capsys.readouterr().err
    assert main(["infer", str(store), "--batch", "0", "--quiet", "--backend", "cpu"]) == 2
    assert "--batch 0: must be at least 1" in capsys.readouterr().err


def test_infer_checks_outputs_before_the_run(tmp_path, capsys):
    store = make_store(tmp_path / "s.h5")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    out = tmp_path / "cats.tsv"
    rc = main(["infer", str(store), "--backend", "cpu", "--quiet", "--out", str(out),
               "--json", str(blocker / "r.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "--json" in err and "is not a directory" in err
    assert not out.exists()  # nothing ran: the categories were never written
    assert main(["infer", str(store), "--quiet", "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_infer_never_writes_over_its_store(tmp_path, capsys):
    store = make_store(tmp_path / "s.h5")
    before = store.read_bytes()
    assert main(["infer", str(store), "--quiet", "--out", str(store)]) == 2
    assert "is the store: refusing to write over an input" in capsys.readouterr().err
    link = tmp_path / "link.h5"
    link.symlink_to(store)
    assert main(["infer", str(store), "--quiet", "--json", str(link)]) == 2
    assert "refusing to write over an input" in capsys.readouterr().err
    assert store.read_bytes() == before
    same = str(tmp_path / "x.out")
    assert main(["infer", str(store), "--quiet", "--out", same, "--json", same]) == 2
    assert "--out and --json are the same file" in capsys.readouterr().err


LIMITED = textwrap.dedent("""
    import resource, signal, sys
    from mpi4py import MPI  # MPI starts before the limit (its start-up writes files)
    from spdnn_mpi.formats.tsv import read as tsv
    if sys.argv[1]:
        tsv.read_layer(sys.argv[1], 64, 64)  # compile the parser before the limit
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # writes beyond 4 KB now fail with EFBIG, as they fail with ENOSPC on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    from spdnn_mpi.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def run_limited(warm_layer: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LIMITED, warm_layer, *argv],
                          capture_output=True, text=True, env=env_for_subprocess(), timeout=120)


def test_failed_write_is_one_line_and_leaves_nothing(tmp_path):
    store = make_store(tmp_path / "s.h5", n_images=3000)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = run_limited("", "infer", str(store), "--backend", "reference", "--quiet",
                       "--out", str(out_dir / "cats.tsv"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"spdnn infer: error: cannot write {out_dir / 'cats.tsv'}: " \
                                  "File too large"
    assert list(out_dir.iterdir()) == []


def test_failed_store_write_is_one_line_and_leaves_nothing(tmp_path):
    """A store write that fails inside HDF5 (prepare of a tree, file size limited)."""
    from spdnn_mpi.formats.tsv import write as tsv_write

    rng = np.random.default_rng(4)
    net = random_network(rng, [64] * 3, 0.5)
    tsv_write.write_tree(tmp_path / "tree", net)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    weights = tmp_path / "tree" / "neuron64"
    proc = run_limited(str(weights / "n64-l1.tsv"), "prepare", "--weights", str(weights),
                       "--out", str(out_dir / "s.h5"), "--quiet")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"spdnn prepare: error: cannot write "
                                                   f"{out_dir / 's.h5'}: "), proc.stderr
    assert list(out_dir.iterdir()) == []


def test_temporaries_of_a_killed_write_are_removed(tmp_path):
    final = tmp_path / "out.tsv"
    script = textwrap.dedent("""
        import sys, time
        from spdnn_mpi.util.atomic import atomic_path
        with atomic_path(sys.argv[1]) as tmp:
            tmp.write_text("half of it")
            print(tmp, flush=True)
            time.sleep(120)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(final)], text=True,
                              stdout=subprocess.PIPE, env=env_for_subprocess())
             for _ in range(2)]
    try:
        temps = [p.stdout.readline().strip() for p in procs]
        assert all(os.path.exists(t) for t in temps)
        os.kill(procs[0].pid, signal.SIGKILL)  # kill -9 in the middle of the write
        procs[0].wait(timeout=30)
        assert os.path.exists(temps[0])  # a killed process cannot clean up after itself
        write_text_atomic(final, "done\n")
        assert final.read_text() == "done\n"
        assert not os.path.exists(temps[0])  # the dead writer's temporary is gone
        assert os.path.exists(temps[1])  # a live writer's temporary is left alone
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def test_atomic_path_failure_reasons(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    with pytest.raises(SpdnnError, match=r"cannot write .*f/out\.tsv"):
        write_text_atomic(blocker / "out.tsv", "y")
    # an error reading some other file inside the block is not called a write error
    with pytest.raises(FileNotFoundError), atomic_path(tmp_path / "o.tsv"):
        open(tmp_path / "missing-input.tsv").close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_check_uses_the_truth_read_at_the_start(tmp_path, monkeypatch, capsys):
    """The store replaced during the run (another store's truth) must not change the verdict."""
    from spdnn_mpi.commands import infer

    store = make_store(tmp_path / "s.h5", seed=21)
    other = make_store(tmp_path / "other.h5", seed=22)
    with Store(store) as a, Store(other) as b:
        assert not np.array_equal(a.truth(4), b.truth(4))

    def replacing_printer(n_ranks):
        def show(done, total, live, seconds):
            if done == total and other.exists():
                os.replace(other, store)
        return show

    monkeypatch.setattr(infer, "progress_printer", replacing_printer)
    assert main(["infer", str(store), "--backend", "cpu", "--check"]) == 0
    assert not other.exists()  # the replacement happened during the run
    assert "check       PASSED" in capsys.readouterr().out


def test_infer_reports_validation_time(tmp_path, capsys):
    import json

    store = make_store(tmp_path / "s.h5")
    rep = tmp_path / "r.json"
    assert main(["infer", str(store), "--backend", "cpu", "--quiet", "--json", str(rep)]) == 0
    report = json.loads(rep.read_text())
    assert 0 < report["validate_seconds"] <= report["load_seconds"]
    assert report["per_rank"][0]["validate_seconds"] == report["validate_seconds"]
    assert "s validation)" in capsys.readouterr().out


def test_generate_refuses_to_replace_without_force(tmp_path, capsys):
    args = ["generate", "--neurons", "256", "--layers", "3", "--seed", "1", "--images", "50",
            "--quiet"]
    text = tmp_path / "notes.txt"
    text.write_text("keep me\n")
    assert main(args + ["--out", str(text)]) == 2
    assert "exists; pass --force to replace it" in capsys.readouterr().err
    assert text.read_text() == "keep me\n"
    assert main(args + ["--out", str(text), "--force"]) == 0
    with Store(text) as st:
        assert st.n_layers == 3
    tree = tmp_path / "tree"
    assert main(args + ["--out", str(tree), "--tsv"]) == 0
    stamp = (tree / "neuron256" / "n256-l1.tsv").stat().st_mtime_ns
    assert main(args + ["--out", str(tree), "--tsv"]) == 2
    assert "neuron256 exists; pass --force" in capsys.readouterr().err
    assert (tree / "neuron256" / "n256-l1.tsv").stat().st_mtime_ns == stamp
    time.sleep(0.01)
    assert main(args + ["--out", str(tree), "--tsv", "--force"]) == 0
    assert (tree / "neuron256" / "n256-l1.tsv").stat().st_mtime_ns != stamp
    assert main(args + ["--out", str(text), "--tsv", "--force"]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_prepare_never_writes_over_an_input(tmp_path, capsys):
    from spdnn_mpi.formats.tsv import write as tsv_write

    rng = np.random.default_rng(11)
    net = random_network(rng, [16] * 3, density=0.3)
    rows = random_inputs(rng, 30, 16)
    written = tsv_write.write_tree(tmp_path / "tree", net, rows, {2: np.array([1, 7])})
    weights = written["weights"]
    for victim, extra in [
        (written["images"], ["--inputs", str(written["images"])]),
        (weights / "n16-l2.tsv", []),
        (written["categories_l2"], ["--categories", str(written["categories_l2"])]),
    ]:
        before = victim.read_bytes()
        assert main(["prepare", "--weights", str(weights), "--out", str(victim), "--force",
                     "--quiet", *extra]) == 2
        assert "refusing to write over an input" in capsys.readouterr().err
        assert victim.read_bytes() == before


def _device(path, minor=3):
    """A character device with /dev/null's numbers (``minor`` 3: writes succeed and vanish)
    or /dev/full's (7: writes fail with ENOSPC). Made in a tmp folder, so the real ones
    are never at risk; needs root."""
    import stat

    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


def test_device_outputs_are_written_not_replaced(tmp_path, capsys):
    import stat

    store = make_store(tmp_path / "s.h5")
    node, other = _device(tmp_path / "null"), _device(tmp_path / "null2")
    assert main(["infer", str(store), "--quiet", "--backend", "cpu", "--out", str(node),
                 "--json", str(other)]) == 0
    assert stat.S_ISCHR(os.stat(node).st_mode) and stat.S_ISCHR(os.stat(other).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "null2", "s.h5"]


def test_write_to_a_full_device_is_one_line(tmp_path, capsys):
    store = make_store(tmp_path / "s.h5")
    full = _device(tmp_path / "full", minor=7)
    assert main(["infer", str(store), "--quiet", "--backend", "cpu", "--json", str(full)]) == 2
    err = capsys.readouterr().err
    assert err == f"spdnn infer: error: cannot write {full}: No space left on device\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "s.h5"]


def test_fifo_output_is_written_through(tmp_path):
    import threading

    fifo = tmp_path / "cats.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    write_text_atomic(fifo, "1\n2\n")
    reader.join(timeout=30)
    assert got == ["1\n2\n"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cats.fifo"]


def test_stores_are_never_written_to_devices(tmp_path, capsys):
    node = _device(tmp_path / "null")
    argv = ["generate", "--neurons", "64", "--layers", "2", "--images", "20", "--quiet",
            "--out", str(node), "--force"]
    assert main(argv) == 2
    assert f"--out {node} is a character device, not a regular file" in capsys.readouterr().err
    with pytest.raises(SpdnnError, match="a character device, not a regular file"):
        write_random_store(node)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


def _no_space_check(monkeypatch):
    """Let a write start whatever its estimate, so the disk fills up in the middle."""
    from spdnn_mpi.util import outputs

    monkeypatch.setattr(outputs, "check_space", lambda *args, **kwargs: None)


@pytest.mark.parametrize("existing", [False, True])
def test_tsv_tree_on_a_full_disk_names_the_output_and_leaves_nothing(small_disk, monkeypatch,
                                                                     capsys, existing):
    _no_space_check(monkeypatch)
    out = small_disk / "tree"
    if existing:
        out.mkdir()
    assert main(["generate", "--neurons", "64", "--layers", "100", "--images", "50", "--quiet",
                 "--tsv", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"spdnn generate: error: cannot write {re.escape(str(out))}/neuron64/"
                        r"n64-l\d+\.tsv: No space left on device\n", err), err
    assert [p.name for p in small_disk.iterdir()] == (["tree"] if existing else [])
    assert not existing or list(out.iterdir()) == []


@pytest.mark.parametrize("estimate", [True, False])
def test_demo_on_a_full_disk_leaves_no_cache_folder(small_disk, monkeypatch, capsys, estimate):
    if not estimate:
        _no_space_check(monkeypatch)
    cache = small_disk / "cache" / "spdnn"
    assert main(["demo", "--images", "300", "--cache-dir", str(cache), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(cache) in err, err
    assert "of disk" in err if estimate else "No space left on device" in err
    assert list(small_disk.iterdir()) == []


def test_one_device_may_take_several_outputs(tmp_path, capsys):
    """`--out /dev/null --json /dev/null` is not one output overwriting another."""
    store = make_store(tmp_path / "s.h5")
    node = _device(tmp_path / "null")
    assert main(["infer", str(store), "--quiet", "--backend", "cpu", "--out", str(node),
                 "--json", str(node)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "s.h5"]
