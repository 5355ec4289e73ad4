"""The static partition and the CPU thread split (pure functions, no MPI needed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spdnn_mpi.comm import cpu_threads_per_rank, partition
from spdnn_mpi.errors import SpdnnError


@given(n=st.integers(0, 5000), parts=st.integers(1, 64))
def test_count_partition_covers_every_item_once(n, parts):
    b = partition(n, parts)
    assert len(b) == parts + 1 and b[0] == 0 and b[-1] == n
    assert np.all(np.diff(b) >= 0)
    sizes = np.diff(b)
    assert sizes.max() - sizes.min() <= 1


@given(weights=st.lists(st.integers(0, 1000), min_size=0, max_size=400),
       parts=st.integers(1, 20))
def test_nnz_partition_covers_every_item_once(weights, parts):
    w = np.array(weights, dtype=np.int64)
    b = partition(len(w), parts, w)
    assert b[0] == 0 and b[-1] == len(w) and np.all(np.diff(b) >= 0)
    covered = np.concatenate([np.arange(b[p], b[p + 1]) for p in range(parts)])
    np.testing.assert_array_equal(covered, np.arange(len(w)))


def test_nnz_partition_balances_skewed_rows():
    w = np.r_[np.full(100, 100), np.full(900, 1)]
    b = partition(len(w), 2, w)
    loads = [w[b[p]:b[p + 1]].sum() for p in range(2)]
    assert max(loads) / (sum(loads) / 2) < 1.1
    assert np.diff(partition(len(w), 2)).tolist() == [500, 500]


def test_more_parts_than_items_gives_empty_ranges():
    b = partition(2, 5)
    assert np.diff(b).tolist().count(0) == 3 and b[-1] == 2


def test_threads_per_rank():
    assert cpu_threads_per_rank(1, 3) == 3
    assert cpu_threads_per_rank(10**6, None) == 1
    with pytest.raises(SpdnnError):
        cpu_threads_per_rank(1, 0)
