"""Distributed inference under MPI (run with `mpiexec -n P python -m pytest --with-mpi`).

Every test also runs with one process; under several ranks the categories
must equal the single-process reference whatever the rank count.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_inputs, random_network, write_random_store

from spdnn_mpi.driver import RunOptions, distributed_infer
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.formats.store.reader import StoreWriter
from spdnn_mpi.reference import reference_categories

pytestmark = pytest.mark.mpi


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def make_store(comm, tmp_path_factory, n_images: int, seed: int = 21):
    """Rank 0 writes a random store; every rank gets its path and the expected categories."""
    path = None
    if comm.Get_rank() == 0:
        path = tmp_path_factory.mktemp("mpi") / "store.h5"
        net, rows = write_random_store(path, seed=seed, n_images=n_images)
        expected = reference_categories(net, rows)
    else:
        expected = None
    path = comm.bcast(str(path) if path else None, root=0)
    return path, comm.bcast(expected, root=0)


@pytest.mark.parametrize("partition", ["count", "nnz"])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_categories_equal_single_process(comm, tmp_path_factory, partition, backend):
    path, expected = make_store(comm, tmp_path_factory, 301)
    report = distributed_infer(comm, RunOptions(store=path, backend=backend,
                                                partition=partition, threads=1))
    if comm.Get_rank() == 0:
        assert 0 < len(expected) < 301
        np.testing.assert_array_equal(report.categories, expected)
        assert report.ranks == comm.Get_size()
        firsts = [r["first_image"] for r in report.per_rank]
        sizes = [r["images"] for r in report.per_rank]
        assert firsts == sorted(firsts) and sum(sizes) == 301
        assert all(f + s == nf for f, s, nf in zip(firsts, sizes, firsts[1:] + [301]))
        assert report.imbalance >= 1.0
    else:
        assert report is None


def test_ranks_with_zero_images(comm, tmp_path_factory):
    path, expected = make_store(comm, tmp_path_factory, 2, seed=5)
    report = distributed_infer(comm, RunOptions(store=path, backend="cpu", threads=1))
    if comm.Get_rank() == 0:
        np.testing.assert_array_equal(report.categories, expected)


def test_weights_read_per_rank_or_per_node_agree(comm, tmp_path_factory):
    path, expected = make_store(comm, tmp_path_factory, 120, seed=9)
    for mode in ("node", "rank"):
        report = distributed_infer(comm, RunOptions(store=path, backend="cpu", threads=1,
                                                    weights_load=mode))
        if comm.Get_rank() == 0:
            np.testing.assert_array_equal(report.categories, expected)


def test_one_failing_rank_stops_every_rank(comm, tmp_path_factory):
    path, _ = make_store(comm, tmp_path_factory, 50)
    bad_rank = comm.Get_size() - 1
    mine = "/nonexistent/store.h5" if comm.Get_rank() == bad_rank else path
    # one process: the plain message; several: prefixed with the failing rank's number
    where = f"rank {bad_rank} of {comm.Get_size()}: " if comm.Get_size() > 1 else ""
    with pytest.raises(SpdnnError, match=f"^{where}.*nonexistent") as exc:
        distributed_infer(comm, RunOptions(store=mine, backend="cpu", threads=1))
    assert exc.value.rank == bad_rank
    assert exc.value.print_here == (comm.Get_rank() == bad_rank)  # printed once, there


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_compression_on_every_rank_matches_off(comm, tmp_path_factory, backend, monkeypatch):
    """Each rank merges its own identical rows, with no communication: same categories.
    Checks are made free on the CPU backend, so this tiny network merges there too."""
    from spdnn_mpi.backends.cpu.backend import CpuBackend
    from spdnn_mpi.check_policy import CheckCosts

    monkeypatch.setattr(CpuBackend, "check_costs", CheckCosts())
    path = None
    if comm.Get_rank() == 0:
        rng = np.random.default_rng(44)  # 126 of 210 survive
        net = random_network(rng, [40] * 8, 0.15, uniform=True)
        base = random_inputs(rng, 30, 40, 0.3).to_dense()
        from spdnn_mpi.model import SparseRows

        rows = SparseRows.from_dense(np.repeat(base, 7, axis=0))  # 210 rows, 30 distinct
        path = tmp_path_factory.mktemp("mpi") / "dups.h5"
        with StoreWriter(path) as w:
            for layer in net.layers:
                w.add_layer(layer)
            w.write_inputs(rows)
        expected = reference_categories(net, rows)
    else:
        expected = None
    path, expected = comm.bcast(str(path) if path else None, root=0), comm.bcast(expected)
    reports = {mode: distributed_infer(comm, RunOptions(store=path, backend=backend, threads=1,
                                                        compress=mode))
               for mode in ("off", "auto")}
    if comm.Get_rank() == 0:
        assert 0 < len(expected) < 210
        for report in reports.values():
            np.testing.assert_array_equal(report.categories, expected)
        events = reports["auto"].compression
        assert events[0]["layer"] == 1  # free checks: the first checkpoint merges
        assert events[0]["representatives"] < events[0]["rows"]
        assert reports["auto"].computed_edges < reports["off"].computed_edges


def test_ranks_given_different_options_stop_together(comm, tmp_path_factory):
    path, expected = make_store(comm, tmp_path_factory, 50)
    layers = 4 if comm.Get_rank() == 0 else 3
    opts = RunOptions(store=path, backend="cpu", threads=1, layers=layers)
    if comm.Get_size() == 1:  # one rank always agrees with itself
        report = distributed_infer(comm, opts)
        np.testing.assert_array_equal(report.categories, expected)
        return
    with pytest.raises(SpdnnError, match="ranks disagree on --layers: rank 0 has --layers 4, "
                                         "rank 1 has --layers 3"):
        distributed_infer(comm, opts)


def test_one_rank_a_node_prepares_the_kernels_first(comm, tmp_path_factory, monkeypatch):
    """The first rank of each node compiles the kernels (a step of its own, before any
    rank lays out the network), so the node's other ranks load its disk cache."""
    from spdnn_mpi import driver
    from spdnn_mpi.backends.cpu.backend import CpuBackend

    events = []

    class Recording(CpuBackend):
        def prepare_kernels(self, layers):
            events.append("prepare")

        def load_network(self, layers, progress=None):
            events.append("layout")
            super().load_network(layers, progress)

    monkeypatch.setattr(driver, "make_backend", lambda name, **options: Recording(**options))
    path, expected = make_store(comm, tmp_path_factory, 60, seed=4)
    report = driver.distributed_infer(comm, RunOptions(store=path, backend="cpu", threads=1))
    local = comm.Split_type(__import__("mpi4py").MPI.COMM_TYPE_SHARED)
    first_on_node = local.Get_rank() == 0
    local.Free()
    assert events == (["prepare", "layout"] if first_on_node else ["layout"])
    if comm.Get_rank() == 0:
        np.testing.assert_array_equal(report.categories, expected)
