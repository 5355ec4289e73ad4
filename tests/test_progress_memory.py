"""Progress lines of long phases, peak-memory reporting and refusing runs that cannot fit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FakeClock, random_inputs, random_network

from spdnn_mpi.cli import main
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.reference import reference_categories, reference_categories_at
from spdnn_mpi.util import memory
from spdnn_mpi.util.progress import Progress, format_seconds, note_if_slow


def test_progress_lines_rate_limited_with_rate_and_time_left():
    clock, lines = FakeClock(), []
    bar = Progress("truth (reference)", 120, lines.append, every=2.0, clock=clock)
    clock.now += 1.0
    bar(10)  # not due yet
    assert lines == []
    clock.now += 1.5
    bar(30, "5000 rows live")
    # the first line says no time left: its rate holds the start-up costs
    assert lines == ["truth (reference): layer 30/120, 5000 rows live, 12.0 layers/s, 2.5 s"]
    clock.now += 0.5
    bar(40)  # within 2 s of the last line
    assert len(lines) == 1
    clock.now += 2.0
    bar(110)  # time left from the recent rate: 80 layers in 2.5 s
    assert lines[-1].endswith("22.0 layers/s, 5.0 s, about 0.3 s left")
    bar(120)  # the end is always printed, with no time left
    assert lines[-1] == "truth (reference): layer 120/120, 24.0 layers/s, 5.0 s"


def test_time_left_ignores_a_slow_first_step():
    """A first layer that compiled kernels for 11 s, then 0.1 s a layer: before, the
    first line said 'about 21 min 49 s left' (the rate since the start)."""
    clock, lines = FakeClock(), []
    bar = Progress("inference", 120, lines.append, every=2.0, clock=clock)
    clock.now += 11.0
    bar(1)
    assert "left" not in lines[-1]
    clock.now += 2.0
    bar(21)
    assert lines[-1].endswith("about 9.9 s left")


def test_progress_quiet_prints_nothing():
    bar = Progress("x", 3, None)
    bar(1), bar(3), bar.note("hello")
    assert not bar.enabled


def test_a_slow_wait_is_explained_and_a_quick_one_is_not():
    import threading

    lines: list[str] = []
    said = threading.Event()
    with note_if_slow(lambda line: (lines.append(line), said.set()), "compiling", after=0.01):
        assert said.wait(5.0)  # the block outlives ``after``: the note comes while it runs
    with note_if_slow(lines.append, "quick", after=0.5):
        pass
    with note_if_slow(None, "quiet", after=0.0):
        pass
    threading.Event().wait(0.7)  # past the quick block's ``after``: its timer was stopped
    assert lines == ["compiling"]


def test_format_seconds():
    assert format_seconds(4.24) == "4.2 s"
    assert format_seconds(185) == "3 min 05 s"
    assert format_seconds(3725) == "1 h 02 min"


def test_reference_reports_every_layer_and_is_unchanged():
    rng = np.random.default_rng(5)
    net = random_network(rng, [40] * 7, 0.25)
    rows = random_inputs(rng, 90, 40, 0.3, binary=False)
    calls = []
    by_count = reference_categories_at(net, rows, [3, 6], lambda k, d="": calls.append((k, d)))
    assert [k for k, _ in calls] == [1, 2, 3, 4, 5, 6]
    assert calls[0][1].endswith("rows live")
    np.testing.assert_array_equal(by_count[6], reference_categories(net, rows))
    np.testing.assert_array_equal(by_count[3], reference_categories(net.truncated(3), rows))


def test_generate_prints_truth_progress_and_quiet_is_silent(tmp_path, capsys):
    argv = ["generate", "--neurons", "256", "--layers", "6", "--images", "300",
            "--out", str(tmp_path / "a.h5")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "truth (reference): layer 6/6" in err and "layers/s" in err
    assert main(argv[:-1] + [str(tmp_path / "b.h5"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_require_names_need_and_availability():
    memory.require(10, "small", available=100)
    with pytest.raises(SpdnnError, match=r"big needs about 2.00 GB .* 1.00 GB is available; try"):
        memory.require(2_000_000_000, "big", "try less", available=1_000_000_000)


def test_peak_host_bytes_reports_this_process():
    peak = memory.peak_host_bytes()
    assert peak["peak_host_bytes"] > 10_000_000  # at least numpy and h5py are loaded
    assert peak["peak_children_bytes"] >= 0
    assert 0 < memory.available_bytes()


def test_small_page_arrays_are_zero_writable_and_opt_out_of_huge_pages():
    import os

    a = memory.small_page_array((3, 5, 7))
    assert a.shape == (3, 5, 7) and a.dtype == np.float32 and a.flags.c_contiguous
    assert a.flags.writeable and not a.any()
    a[2, 4, 6] = 1.5
    assert a.sum() == 1.5
    assert memory.small_page_array((0, 4), np.int64).shape == (0, 4)
    if not os.path.isdir("/sys/kernel/mm/transparent_hugepage"):
        return  # no huge pages here to opt out of
    start = a.__array_interface__["data"][0]
    with open("/proc/self/smaps") as fh:
        lines = fh.read().splitlines()
    for k, line in enumerate(lines):
        lo, _, rest = line.partition("-")
        if rest and " " in rest and int(lo, 16) == start:
            flags = next(ln for ln in lines[k + 1:] if ln.startswith("VmFlags:"))
            assert " nh" in flags  # MADV_NOHUGEPAGE
            return
    raise AssertionError("the array's mapping is not in /proc/self/smaps")


def test_generate_refuses_reference_truth_that_cannot_fit(tmp_path, monkeypatch, capsys):
    """At 60000 x 16384 the reference needs about 12 GB: refused at once, nothing written."""
    monkeypatch.setattr(memory, "available_bytes", lambda: 4_000_000_000)
    out = tmp_path / "big.h5"
    assert main(["generate", "--neurons", "16384", "--layers", "120", "--out", str(out),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "truth by the reference backend (60000 images x 16384 neurons" in err
    assert "4.00 GB is available" in err and "--truth-backend cpu" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_prepare_refuses_reference_truth_that_cannot_fit(real_dir, tmp_path, monkeypatch,
                                                         capsys):
    monkeypatch.setattr(memory, "available_bytes", lambda: 100_000_000)
    out = tmp_path / "r.h5"
    assert main(["prepare", "--weights", str(real_dir), "--layers", "4", "--generate-inputs",
                 "--truth-layers", "4", "--out", str(out), "--quiet"]) == 2
    assert "needs about" in capsys.readouterr().err and not out.exists()


def _resident_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 1e6


def test_graphblas_peer_memory_stays_flat_over_layers():
    """A fresh matrix per step (.new()) let the peer's resident memory grow with every
    layer, to 12.2 GB at 1024 x 120; in-place updates keep it flat. Here: 4000 live
    rows of 256 neurons, 12 MB a matrix; the old code kept 290 MB after 20 layers."""
    pytest.importorskip("graphblas")
    from spdnn_mpi.bench.peers.graphblas import graphblas_infer

    rng = np.random.default_rng(9)
    warm = random_network(rng, [256] * 3, 0.1, uniform=True)
    net = random_network(rng, [256] * 21, 0.1, uniform=True)
    rows = random_inputs(rng, 4000, 256, 0.3)
    graphblas_infer(warm, rows, threads=1)  # library start-up is not per layer
    before = _resident_mb()
    ids, _ = graphblas_infer(net, rows, threads=1)
    assert len(ids) > 3000  # rows stayed alive: every layer had full-size matrices
    assert _resident_mb() - before < 100


def test_graphblas_peer_refuses_when_it_cannot_fit(monkeypatch):
    from spdnn_mpi.bench.peers.graphblas import graphblas_memory_check

    rng = np.random.default_rng(1)
    net = random_network(rng, [64] * 3, 0.3)
    rows = random_inputs(rng, 1000, 64, 0.3)
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000)
    with pytest.raises(SpdnnError, match="peer graphblas .1000 images x 64 neurons. needs"):
        graphblas_memory_check(net, rows)
