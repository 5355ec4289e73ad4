"""A GPU peer that runs out of device memory is reported as skipped; the benchmark goes on.

Seen on an H100 (80 GB): the cuSPARSE peer at 60000 x 65536 beside our
buffers stopped `spdnn bench` with CuPy's OutOfMemoryError and a traceback,
losing the configurations after it. The fakes below raise an exception of
the same class name as CuPy's and PyTorch's.
"""

from __future__ import annotations

import json
import weakref

import numpy as np
import pytest

from spdnn_mpi.bench.peers import device_memory
from spdnn_mpi.bench.peers import gpu_sparse as gpu
from spdnn_mpi.cli import main
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import SparseRows


class OutOfMemoryError(Exception):
    """Named as cupy.cuda.memory.OutOfMemoryError and torch.cuda.OutOfMemoryError are."""


class _Big:
    """Stands for a device array the failed peer held."""


class _Net:
    n_inputs = 5


def _rows(n: int) -> SparseRows:
    return SparseRows(5, np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.uint16))


def test_out_of_memory_becomes_a_skip_after_the_arrays_are_released(monkeypatch):
    held: list[weakref.ref] = []
    released_before_free: list[bool] = []
    monkeypatch.setattr(device_memory, "free_device_caches",
                        lambda: released_before_free.append(held[0]() is None))

    @device_memory.out_of_memory_is_a_skip("cusparse")
    def peer(network, rows):
        big = _Big()
        held.append(weakref.ref(big))
        raise OutOfMemoryError("Out of memory allocating 31,457,280,000 bytes")

    with pytest.raises(SpdnnError) as info:
        peer(_Net(), _rows(7))
    msg = str(info.value)
    assert msg.startswith("peer cusparse ran out of GPU memory at 7 images x 5 inputs")
    assert "31,457,280,000 bytes" in msg
    assert released_before_free == [True]


def test_other_errors_pass_through_and_results_are_returned(monkeypatch):
    monkeypatch.setattr(device_memory, "free_device_caches",
                        lambda: pytest.fail("nothing to free"))

    @device_memory.out_of_memory_is_a_skip("torch")
    def failing(network, rows):
        raise ValueError("a real bug")

    @device_memory.out_of_memory_is_a_skip("torch")
    def working(network, rows, *, batch=None, repeat=3):
        return rows.n_rows, batch, repeat

    with pytest.raises(ValueError, match="a real bug"):
        failing(_Net(), _rows(2))
    assert working(_Net(), _rows(4), batch=2, repeat=5) == (4, 2, 5)
    assert device_memory.is_out_of_memory(OutOfMemoryError())
    assert not device_memory.is_out_of_memory(MemoryError())


def test_bench_reports_a_peer_out_of_memory_as_skipped_and_finishes(tmp_path, monkeypatch,
                                                                    capsys):
    store = tmp_path / "s.h5"
    assert main(["generate", "--neurons", "1024", "--layers", "4", "--images", "200",
                 "--seed", "3", "--out", str(store), "--quiet"]) == 0
    monkeypatch.setattr(device_memory, "free_device_caches", lambda: None)

    @device_memory.out_of_memory_is_a_skip("cusparse")
    def cusparse_out_of_memory(network, rows):
        raise OutOfMemoryError("Out of memory allocating 1,024 bytes")

    monkeypatch.setattr(gpu, "cusparse_infer", cusparse_out_of_memory)
    out = tmp_path / "b.json"
    assert main(["bench", str(store), "--backend", "cpu", "--peer", "cusparse",
                 "--repeat", "1", "--json", str(out), "--quiet"]) == 0
    res = json.loads(out.read_text())["results"][0]
    skipped = res["peers"]["cusparse"]["skipped"]
    assert skipped.startswith("peer cusparse ran out of GPU memory at 200 images x 1024 inputs")
    assert res["modes"]["off"]["check"]["passed"]
    assert "Traceback" not in capsys.readouterr().err
