"""The CUDA backend's layer loop and readback (no GPU): the layer queue, its graph
cache and the packed results, with fake kernels, streams and device arrays."""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.graphs import GraphCache
from spdnn_mpi.backends.cuda.launch import Launch, LayerLaunch
from spdnn_mpi.backends.cuda.layer_queue import LayerQueue


def test_compaction_pass_only_before_kernels_that_cannot_write_it():
    """The layer loop launches compact_rows after a layer that may drop rows only
    when the next layer's kernel does not compact on write (the general CSR); after
    the last layer a compaction stays pending (finish reads the mask)."""
    calls = []

    def kernel(name):
        return lambda grid, threads, args, shared_mem=0: calls.append(name)

    kinds = ["group", "csr_global", "smem32", "global", "csr_smem", "csr4_smem",
             "csr4_global", "group"]
    buffers = types.SimpleNamespace(ptrs=None, state=None, live_hist=None, stamps=None)
    queue = LayerQueue(buffers, None, contextlib.nullcontext(), None, 132, graphs=False)
    queue.attach(types.SimpleNamespace(get_function=kernel),
                 [LayerLaunch(lay.LayerPlan(kind, kind, 0, 0), Launch(kernel(kind), 1, 32, 0),
                              {}, 8, 8, (), (), (), ()) for kind in kinds])
    for k in range(len(kinds)):
        queue.launch(k, drop_dead=True, held=0)
    assert calls == ["group", "compact_rows", "csr_global", "smem32", "global",
                     "compact_rows", "csr_smem", "csr4_smem", "csr4_global", "group"]
    calls.clear()
    queue.launch(0, drop_dead=False, held=0)  # nothing dropped: nothing to move
    assert calls == ["group"]
    assert not lay.compacts_on_write("csr_smem") and lay.compacts_on_write("group")


class _FakeStream:
    def __init__(self, fail=False):
        self.fail, self.captured = fail, []

    def begin_capture(self):
        if self.fail:
            raise RuntimeError("capture not supported")

    def end_capture(self):
        return ("graph", len(self.captured))


def test_graph_cache_keys_pieces_by_what_they_launch_and_turns_off_on_failure():
    cache = GraphCache(on=True)
    todo = ((0, True), (1, False))
    tail_a = (4, 3, 10, True, (1000, 5000, 123))  # grid, sizes, (device, host, words)
    key_a = cache.key(todo, 0, tail_a)
    assert cache.key(todo, 0, (4, 3, 10, True, (1000, 5000, 123))) == key_a
    for other in (cache.key(todo, 16, tail_a),  # rows held
                  cache.key(todo, 0, (4, 3, 10, True, (2000, 5000, 123))),
                  cache.key(todo, 0, (4, 3, 10, True, (1000, 5000, 0))),
                  cache.key(todo, 0, (8, 3, 10, True, (1000, 5000, 123))),
                  cache.key(todo, 0, None),  # no gather
                  cache.key(todo[:1], 0, tail_a)):  # layers
        assert other != key_a
    stream, launched = _FakeStream(), []
    graph = cache.capture(stream, key_a, lambda: launched.append("piece"))
    assert launched == ["piece"] and cache.get(key_a) is graph and cache.any() is graph
    cache.clear()
    assert cache.get(key_a) is None and cache.any() is None
    assert cache.capture(_FakeStream(fail=True), key_a, lambda: None) is None
    assert not cache.on and "capture not supported" in cache.note
    assert cache.get(key_a) is None


def test_layer_pieces_are_captured_once_then_launched_as_graphs():
    """The layer queue over the graph cache (host logic, fake stream): a piece is
    captured on first sight and its graph launched; the same piece again is only
    launched; with graphs off the layers are launched one by one."""
    class Graph:
        def __init__(self, log):
            self.log = log

        def launch(self, stream=None):
            self.log.append("graph")

    log: list[str] = []

    class Stream(contextlib.nullcontext):
        def begin_capture(self):
            log.append("begin")

        def end_capture(self):
            log.append("end")
            return Graph(log)

    results = types.SimpleNamespace(
        enqueue_copy=lambda stream, words: log.append(f"copy{words}"))
    queue = LayerQueue(types.SimpleNamespace(loaded_rows=0), results, contextlib.nullcontext(),
                       Stream(), 132, graphs=True)
    queue.attach(types.SimpleNamespace(get_function=lambda name: (
        lambda grid, threads, args: log.append("gather"))), [])
    queue.launch = lambda k, drop, held: log.append(f"layer{k}")
    gather = (4, (np.int32(3),), (4, 3, (1, 2, 77)), 77)
    for expected in (["begin", "layer0", "layer1", "gather", "copy77", "end", "graph"],
                     ["graph"]):
        log.clear()
        queue.start_batch()
        queue.add(0, True)
        queue.add(1, False)
        queue.flush(gather=gather)
        assert log == expected
    log.clear()  # another copy size is another graph
    queue.pending = [(0, True), (1, False)]
    queue.flush(gather=(4, (np.int32(3),), (4, 3, (1, 2, 0)), 0))
    assert log == ["begin", "layer0", "layer1", "gather", "end", "graph"]
    log.clear()  # other rows held: another graph; then the first one again, found by
    for held, rows in ((8, 0), (0, 5)):  # its key (no one launch: the rows loaded are not in it)
        queue.held, queue._buffers.loaded_rows = held, rows
        queue.pending = [(0, True), (1, False)]
        queue.flush(gather=gather)
    assert log == ["begin", "layer0", "layer1", "gather", "copy77", "end", "graph", "graph"]
    log.clear()  # the last graph, again as it was: only launched
    queue.pending = [(0, True), (1, False)]
    queue.flush(gather=gather)
    assert log == ["graph"]
    log.clear()  # merging: the piece is captured for every number of rows held
    queue.merging, queue.pending = True, [(2, True)]
    queue.flush()
    assert log == ["begin", "layer2", "end"] * 4 + ["graph"]
    queue.graphs.on = False
    log.clear()
    queue.pending = [(0, True)]
    queue.flush(gather=gather)
    assert log == ["layer0", "gather", "copy77"]


@pytest.mark.parametrize("ascending, ordered", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("want_features", [True, False])
def test_packed_results_are_read_back_in_position_order(want_features, ascending, ordered):
    """The layout gather_results writes (cuda/spdnn_rows.cu) as finish reads it:
    counts, 64-bit stamps in two words, positions and features in slot order
    (``ordered``: the caller vouches that they ascend, as they do without merges).
    Nothing read back may be a view of the (reused, pinned) host buffer."""
    from spdnn_mpi.backends.cuda.readback import ST_SIZE, results_head, unpack_results

    n_run, width = 3, 5
    state = np.arange(ST_SIZE, dtype=np.int32)
    live = np.array([9, 7, 4], dtype=np.int32)
    stamps = np.array([2**40 + 1, 2**40 + 5000, 3 * 2**33, 2**62 + 77], dtype=np.uint64)
    pos = np.array([3, 7, 12, 40] if ascending else [12, 3, 40, 7], dtype=np.int32)
    feats = np.random.default_rng(0).normal(size=(4, width)).astype(np.float32)
    data = np.concatenate([[4], state, live, stamps.view(np.int32), pos,
                           feats.view(np.int32).ravel() if want_features else []]).astype(np.int32)
    assert results_head(n_run) == 1 + ST_SIZE + n_run + 2 * (n_run + 1)
    got_state, got_live, got_stamps, got_pos, got_feats = unpack_results(data, n_run, width,
                                                                         want_features, ordered)
    data[:] = -1  # the next batch's copy into the same buffer
    assert np.array_equal(got_state, state) and got_live == [9, 7, 4]
    assert all(type(v) is int for v in got_live)
    assert got_stamps == stamps.tolist() and all(type(v) is int for v in got_stamps)
    assert got_pos.tolist() == [3, 7, 12, 40] and got_pos.dtype == np.int64
    if want_features:
        assert np.array_equal(got_feats, feats if ascending else feats[[1, 3, 0, 2]])
    else:
        assert got_feats is None


class _FakeDeviceArray:
    """A NumPy array (``values``) with CuPy's ``data.ptr`` and ``get(stream=, out=)``;
    records the copies."""

    def __init__(self, values, copies):
        self.values, self.copies = values, copies
        self.data = types.SimpleNamespace(ptr=values.ctypes.data)

    @property
    def size(self):
        return self.values.size

    def __getitem__(self, key):
        return _FakeDeviceArray(self.values[key], self.copies)

    def get(self, stream=None, out=None):
        self.copies.append(self.values.size)
        if out is None:
            return self.values.copy()
        out[...] = self.values
        return out


@pytest.mark.parametrize("rows, width", [(1000, 10), (300_000, 10)])
def test_packed_results_copy_in_one_piece_or_head_then_survivors(monkeypatch, rows, width):
    """Small batches: one copy, queued behind the gather (capturable), into the reused
    pinned buffer; large ones: the head, then exactly the survivors. The buffers
    are reused while large enough, and the graph key names their addresses."""
    import contextlib
    import ctypes
    import sys

    from spdnn_mpi.backends.cuda import readback as rb

    copies: list[int] = []

    def memcpy_async(dst, src, nbytes, kind, stream):
        assert kind == "d2h" and stream == 99
        copies.append(nbytes // 4)
        ctypes.memmove(dst, src, nbytes)

    class FakeCp:
        cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(
            memcpyAsync=memcpy_async, memcpyDeviceToHost="d2h"), alloc_pinned_memory=bytearray)

        @staticmethod
        def empty(words, dtype):
            return _FakeDeviceArray(np.zeros(words, dtype=dtype), copies)

    monkeypatch.setitem(sys.modules, "cupyx", None)  # refused: its import pulls in SciPy
    packed = rb.PackedResults(FakeCp(), contextlib.nullcontext())
    head, per_row, alive = rb.results_head(3), 1 + width, rows // 2
    upper = head + rows * per_row
    plan = packed.prepare(3, width, True, rows)
    out = packed.device
    assert plan == (head, per_row, upper, upper if packed.fits_one_copy(upper) else 0)
    key = packed.copy_key(upper)
    assert packed.ensure(upper - 5) is out and packed.allocations == 2  # reused
    assert packed.copy_key(upper) == key and key[1] == out.data.ptr and key[3] == upper
    out.values[0] = alive
    out.values[head:head + alive * per_row] = 7
    waits: list[str] = []
    stream = types.SimpleNamespace(ptr=99, synchronize=lambda: waits.append("wait"))
    if plan.copy:
        packed.enqueue_copy(stream, plan.copy)  # what the graph ends with
        data = packed.fetch(stream, plan)
        assert copies == [upper] and data.size == upper and waits == ["wait"]
    else:
        data = packed.fetch(stream, plan)
        assert copies == [head, head + alive * per_row] and data.size == head + alive * per_row
    assert int(data[0]) == alive and np.all(data[head:head + alive * per_row] == 7)
    packed.release()
    assert packed.device is None
    assert packed.ensure(upper) is not out and packed.allocations == 3  # the device array
    # allocated again, at the same address or not: no graph of the old one is reused
    assert packed.copy_key(upper) != key


def test_packed_results_pin_only_what_one_copy_reads():
    """A caller that copies at most ``host_words`` ahead (the merge) gets a pinned
    buffer of that size, not one as long as the device array."""
    from spdnn_mpi.backends.cuda import readback as rb

    fake_cp = types.SimpleNamespace(
        empty=lambda words, dtype: _FakeDeviceArray(np.zeros(words, dtype=dtype), []),
        cuda=types.SimpleNamespace(alloc_pinned_memory=bytearray))
    bounded = rb.PackedResults(fake_cp, contextlib.nullcontext())
    assert bounded.ensure(120_002, 16384).size == 120_002
    assert bounded._host.size == 16384
    whole = rb.PackedResults(fake_cp, contextlib.nullcontext())
    whole.ensure(120_002)
    assert whole._host.size == 120_002


def test_host_mirrors_of_the_device_state_and_pointer_table_match_the_kernels():
    """The state slots and the pointer table's size the host reads or fills are the
    #defines of cuda/spdnn_common.cuh (a slot moved on one side only would read the
    wrong word without any error)."""
    import re

    from spdnn_mpi.backends.cuda import features, readback
    from spdnn_mpi.backends.cuda.layout import kernel_source_dir

    text = kernel_source_dir().joinpath("spdnn_common.cuh").read_text(encoding="utf-8")
    defines = {m[1]: int(m[2]) for m in re.finditer(r"^#define (\w+) (\d+)\b", text, re.M)}
    for name in ("ST_ROWS", "ST_TILES", "ST_COMPACTIONS", "ST_PADDED_COMPACTIONS", "ST_LAYERS",
                 "ST_INPUT_BITS", "ST_SIZE"):
        assert getattr(readback, name) == defines[name], name
    assert features.P_SIZE == defines["P_SIZE"]
    slots = [v for k, v in defines.items() if k.startswith("ST_") and k != "ST_SIZE"]
    assert len(set(slots)) == len(slots) and max(slots) < defines["ST_SIZE"]
