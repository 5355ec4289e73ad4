"""Argmax stores under MPI: every rank count gives the single-process predictions."""

from __future__ import annotations

import numpy as np
import pytest
from model_stores import classifier_store


@pytest.mark.mpi
@pytest.mark.parametrize("partition", ["count", "nnz"])
def test_predictions_under_mpi_equal_the_reference(tmp_path_factory, partition):
    from mpi4py import MPI

    from spdnn_mpi.cli import main

    comm = MPI.COMM_WORLD
    d = comm.bcast(str(tmp_path_factory.mktemp("argmax")) if comm.rank == 0 else None)
    preds = classifier_store(f"{d}/m.h5", n_images=211)[2] if comm.rank == 0 else None
    comm.Barrier()
    status = main(["infer", f"{d}/m.h5", "--backend", "cpu", "--threads", "1", "--check",
                   "--out", f"{d}/p.tsv", "--quiet", "--partition", partition])
    assert status == 0
    if comm.rank == 0:
        table = np.loadtxt(f"{d}/p.tsv", dtype=np.int64, delimiter="\t")
        np.testing.assert_array_equal(table[:, 0], np.arange(1, 212))
        np.testing.assert_array_equal(table[:, 1], preds)
