"""``util.workers.WorkerPool`` (results in order, bounded, errors and deaths reported) and
``util.progress.Progress`` with a share of the work instead of steps."""

from __future__ import annotations

import gc
import os
import signal

import pytest
from conftest import FakeClock

from spdnn_mpi.errors import InputFormatError, SpdnnError
from spdnn_mpi.util.progress import Progress
from spdnn_mpi.util.signals import deferred_signals
from spdnn_mpi.util.workers import WorkerPool, default_jobs


def square(task):
    if task == "bad":
        raise InputFormatError("n16-l3.tsv", 7, "output neuron j is not an integer")
    if task == "unpicklable":
        raise ValueError(lambda: None)
    if task == "die":
        os._exit(3)
    if task == "batch":
        return [1, 2, 3]
    if task == "frozen":
        return gc.get_freeze_count()
    return task * task


def test_results_in_task_order_with_a_bounded_window():
    taken = []

    def tasks():
        for k in range(40):
            taken.append(k)
            yield k

    with WorkerPool(square, 3) as pool:
        for handed, result in enumerate(pool.map(tasks(), window=4)):
            assert result == handed * handed
            assert len(taken) - handed <= 4 + 1  # this one is handed on: 4 more at most
    assert taken == list(range(40))


def test_flat_hands_on_the_items_of_each_result():
    with WorkerPool(square, 2) as pool:
        assert list(pool.map(["batch", "batch"], window=2, flat=True)) == [1, 2, 3, 1, 2, 3]


def test_a_worker_error_is_raised_as_it_was_raised():
    with WorkerPool(square, 2) as pool, pytest.raises(InputFormatError) as info:
        list(pool.map([1, 2, "bad", 4], window=2))
    assert str(info.value) == "n16-l3.tsv:7: output neuron j is not an integer"
    assert info.value.line == 7


def test_an_error_that_does_not_pickle_comes_back_as_its_traceback():
    with WorkerPool(square, 1) as pool, pytest.raises(RuntimeError, match="ValueError"):
        list(pool.map(["unpicklable"], window=1))


def test_a_worker_that_dies_is_an_error_not_a_hang():
    with WorkerPool(square, 2) as pool, pytest.raises(SpdnnError, match="exit status 3"):
        list(pool.map([1, "die", 3], window=2))


def test_a_worker_killed_while_idle_is_an_error_too():
    with WorkerPool(square, 1) as pool:
        assert list(pool.map([2], window=1)) == [4]
        proc = pool._workers[0][0]
        proc.kill()
        proc.join()
        with pytest.raises(SpdnnError, match="signal 9"):
            list(pool.map([3], window=1))


def test_close_stops_every_worker():
    pool = WorkerPool(square, 2)
    procs = [proc for proc, _ in pool._workers]
    assert all(proc.is_alive() for proc in procs)
    pool.close(graceful=False)
    assert not any(proc.is_alive() for proc in procs)
    assert default_jobs() >= 1


def test_deferred_signals_hold_a_signal_until_the_block_ends():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append("handled"))
    try:
        with deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            seen.append("block done")
        assert seen == ["block done", "handled"]
    finally:
        signal.signal(signal.SIGTERM, previous)



def test_progress_time_left_from_a_share_of_the_work():
    """Layers of an archive come in any order: the share of the archive read says how
    far along it is; the layers written so far (2 of an unknown total) do not."""
    clock, lines = FakeClock(0.0), []
    bar = Progress("", None, lines.append, every=1.0, clock=clock)
    clock.now = 1.0
    bar(2, "10% read", fraction=0.1)
    assert lines == ["layer 2, 10% read, 2.0 layers/s, 1.0 s"]  # no time left on the first
    clock.now = 3.0
    bar(5, "30% read", fraction=0.3)  # 20% in 2 s: 70% left is 7 s
    assert lines[-1] == "layer 5, 30% read, 1.7 layers/s, 3.0 s, about 7.0 s left"
    bar.total = 9
    bar(9)
    assert lines[-1] == "layer 9/9, 3.0 layers/s, 3.0 s"


def test_workers_leave_inherited_objects_to_the_parent():
    """A forked worker's collections skip what it inherited (no copy of those pages);
    the parent collects as before."""
    before = gc.get_freeze_count()
    with WorkerPool(square, 2) as pool:
        assert gc.get_freeze_count() == before
        frozen = list(pool.map(["frozen", "frozen"], window=2))
    assert all(count > before for count in frozen)
