"""The CUDA backend's wiring on a fake CuPy (no GPU): what it launches, in which order.

The fake runs no kernel: arrays are NumPy arrays with CuPy's few extra
methods, kernels record their names, streams record captures. So this checks
the host side only (which kernel, which compaction pass, which graph), not
the numbers, which the GPU tests in tests/gpu compare with the reference.
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys
import types

import numpy as np
import pytest
from conftest import block_layer, fixed_degree_layer, random_network

from spdnn_mpi.backends.cuda import held
from spdnn_mpi.backends.cuda.readback import ST_ROWS
from spdnn_mpi.model import Network, SparseRows

#: An H100's properties, as far as the backend reads them.
PROPS = {"name": b"fake H100", "major": 9, "multiProcessorCount": 132,
         "sharedMemPerBlockOptin": 232448,
         "regsPerMultiprocessor": 65536, "maxThreadsPerMultiProcessor": 2048,
         "sharedMemPerMultiprocessor": 233472, "l2CacheSize": 50 << 20}


class DevArray(np.ndarray):
    """A NumPy array with CuPy's ``data.ptr``, ``get`` and ``set``; items stay arrays."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def __getitem__(self, key):
        out = super().__getitem__(key)
        return out if isinstance(out, np.ndarray) else np.asarray(out).view(DevArray)

    def get(self, stream=None, out=None):
        host = np.asarray(self).copy()
        if out is None:
            return host
        out[...] = host
        return out

    def set(self, values, stream=None):
        self[...] = values


def _array_operand_only(name):
    """CuPy sends an operator with a number (``a * 2``, ``a == 0``) through NumPy's
    ufunc dispatch, which imports cupyx.scipy.special: the backend calls xp's ufuncs."""
    plain = getattr(np.ndarray, name)

    def op(self, other):
        if not isinstance(other, np.ndarray):
            raise AssertionError(f"{name} of a device array with {other!r}: call the ufunc")
        return plain(self, other)

    return op


for _name in ("__add__", "__sub__", "__mul__", "__floordiv__", "__mod__", "__lshift__",
              "__rshift__", "__and__", "__or__", "__xor__", "__eq__", "__ne__", "__lt__",
              "__le__", "__gt__", "__ge__"):
    setattr(DevArray, _name, _array_operand_only(_name))


class LaunchLog(list):
    """Names of what was launched, in order; ``cooperative``: (kernel, grid) of each
    cooperative launch."""

    def __init__(self):
        super().__init__()
        self.cooperative: list[tuple] = []


class Recorder:
    """What was launched, in order."""

    def __init__(self):
        self.log = LaunchLog()


def fake_cupy(rec: Recorder) -> types.ModuleType:
    """A ``cupy`` module whose kernels, streams and graphs write to ``rec.log``."""

    class Kernel:
        def __init__(self, name):
            self.name, self.num_regs, self.shared_size_bytes = name, 64, 0
            self.max_dynamic_shared_size_bytes = 0

        def __call__(self, grid, block, args, shared_mem=0):
            rec.log.append(self.name)
            if self.name == "plan_reps":  # the header of the merge's copy: [rows, kept]
                args[4][:2] = (int(args[1][ST_ROWS]), 0)
            if self.name == "emit_groups":  # its positions (none kept): 0, 1, 2, ...
                n = int(args[1][ST_ROWS])
                args[4][2:2 + 2 * n] = np.arange(2 * n)

        @property
        def kernel(self):  # as CuPy's RawKernel: its compiled function
            def launch(grid, block, args, shared_mem=0, stream=None,
                       enable_cooperative_groups=False):
                rec.log.append(self.name)
                if enable_cooperative_groups:
                    rec.log.cooperative.append((self.name, grid))
            return launch

    class Module:
        def __init__(self, code, options, name_expressions):
            self.names = set(name_expressions)
            self.kernels: dict[str, Kernel] = {}

        def compile(self):
            rec.log.append("compile")

        def get_function(self, name):
            # as NVRTC: a template exists only where it was asked for at compile time
            if "<" in name and name not in self.names:
                raise AssertionError(f"{name} was not among the module's instantiations")
            return self.kernels.setdefault(name, Kernel(name))

    class Graph:
        def launch(self, stream=None):
            rec.log.append("graph")

    class Stream:
        ptr = 7

        def __init__(self, non_blocking=False):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def synchronize(self):
            pass

        def begin_capture(self):
            rec.log.append("capture(")

        def end_capture(self):
            rec.log.append(")")
            return Graph()

    def memcpy(dst, src, nbytes, kind, stream):
        rec.log.append("copy")
        ctypes.memmove(dst, src, nbytes)

    cp = types.ModuleType("cupy")
    for name in ("int32", "int64", "uint16", "uint32", "uint64", "float32", "nonzero",
                 "cumsum", "flatnonzero", "any", "argsort", "ascontiguousarray", "multiply",
                 "subtract", "floor_divide", "remainder", "left_shift", "right_shift",
                 "equal"):
        setattr(cp, name, getattr(np, name))
    def on_device(make):
        return lambda *args, **kw: make(*args, **kw).view(DevArray)

    for name in ("asarray", "zeros", "ones", "full", "arange"):
        setattr(cp, name, on_device(getattr(np, name)))
    cp.empty = on_device(np.zeros)  # no kernel writes here: what they would is zero
    cp.ndarray = DevArray
    cp.RawModule = Module
    pool = types.SimpleNamespace(total_bytes=lambda: 0, free_bytes=lambda: 0,
                                 free_all_blocks=lambda: None)
    cp.get_default_memory_pool = lambda: pool
    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, getDevice=lambda: 0, getDeviceProperties=lambda i: PROPS,
        memGetInfo=lambda: (40 << 30, 80 << 30), memcpyAsync=memcpy, memcpyDeviceToHost="d2h")
    cp.cuda = types.SimpleNamespace(runtime=runtime, Stream=Stream, Device=lambda i: Stream(),
                                    alloc_pinned_memory=bytearray)
    return cp


@pytest.fixture
def backend_and_log(monkeypatch):
    from spdnn_mpi.backends.cuda import compile as comp
    from spdnn_mpi.backends.cuda import launch
    from spdnn_mpi.backends.cuda import layout as lay

    def host_group_layouts(self, layers):  # no kernel runs here: the host reference's
        return [dataclasses.replace(g, indices=self.cp.asarray(g.indices),
                                    out_ids=self.cp.asarray(g.out_ids),
                                    weights=self.cp.asarray(g.weights))
                for g in lay.group_layouts(layers)]

    rec = Recorder()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(rec))
    # cupyx is refused: importing it pulls in SciPy (0.3 s of a run on a real GPU)
    monkeypatch.setitem(sys.modules, "cupyx", None)
    monkeypatch.setattr(comp, "_MODULES", {})  # no fake module left for a real GPU test
    monkeypatch.setattr(launch.Launcher, "group_layouts", host_group_layouts)
    from spdnn_mpi.backends.cuda.backend import CudaBackend

    return CudaBackend(), rec.log


def _network(rng) -> Network:
    """One layer of each kind the loop treats apart: grouped (uniform), general CSR
    (32-bit indices: no compaction on write), staged ELL, narrow CSR4."""
    general = random_network(rng, [256, 200], 0.05).layers[0]
    general.indices = general.indices.astype(np.int32)
    head = random_network(rng, [128, 10], 0.2).layers[0]
    return Network([block_layer(rng, 300, 256, 16, values=False, min_group=16), general,
                    fixed_degree_layer(rng, 200, 128, 16), head])


def test_a_batch_launches_its_layers_once_captured_then_as_one_graph(backend_and_log):
    backend, log = backend_and_log
    rng = np.random.default_rng(0)
    net = _network(rng)
    rows = SparseRows.from_dense((rng.random((100, 300)) < 0.2).astype(np.float32))
    backend.load_network(net.layers)
    info = backend.describe()
    # the ELL layer was planned grouped: its sparse groups showed once laid out, and its
    # kernel came in a second program
    assert log == ["compile", "compile"] and info["graphs"] == "on"
    assert info["kernel_names"] == {"layer_group_sum<16>": 1, "layer_csr<true,true,int>": 1,
                                    "layer_ell_smem<16,32,false>": 1,
                                    "layer_csr4<false,true>": 1}
    assert not any("push" in key for key in info)
    layers = ["layer_group_sum<16>", "compact_rows", "layer_csr<true,true,int>",
              "layer_ell_smem<16,32,false>", "layer_csr4<false,true>"]
    captured = []  # the host time graph captures took: counted once, not on a replay
    for expected in (["capture(", *layers, "gather_results", "copy", ")", "graph"], ["graph"]):
        log.clear()
        backend.load_features(rows, drop_empty=True)
        for k in range(len(net.layers)):
            backend.run_layer(k, drop_dead=True)
        # binary inputs to a first layer on the shared-sum kernel: as bits; the layers
        # wait for finish
        assert log == ["scatter_bits<u16>", "stamp"]
        # host work handed to finish runs once everything is launched, before the wait
        res = backend.finish(want_features=True, meanwhile=lambda: log.append("meanwhile"))
        assert log[2:] == [*expected, "meanwhile"]
        captured.append(backend.one_time_seconds())
        assert res.features.shape == (0, 10) and res.live_per_layer == [0, 0, 0, 0]
    assert 0 < captured[0] == captured[1]
    backend.release_buffers()
    assert backend.max_batch_rows(1024) >= 32


def test_binary_inputs_go_in_as_bits_where_the_first_layer_reads_them_so(backend_and_log):
    """Inputs whose every value is 1 go to the device as one bit a row of a word a
    neuron (scatter_bits; ST_INPUT_BITS tells the first layer) where that layer runs on
    the shared-sum kernel; rows with values, or a first layer on another kernel, get
    the float tiles (scatter_rows)."""
    from spdnn_mpi.backends.cuda.readback import ST_INPUT_BITS

    backend, log = backend_and_log
    rng = np.random.default_rng(8)
    net = _network(rng)
    binary = SparseRows.from_dense((rng.random((40, 300)) < 0.2).astype(np.float32))
    valued = SparseRows.from_dense(rng.random((40, 300)).astype(np.float32)
                                   * (rng.random((40, 300)) < 0.2))
    assert binary.values is None and valued.values is not None
    binary_256 = SparseRows.from_dense((rng.random((40, 256)) < 0.2).astype(np.float32))
    runs = [(net.layers, binary, "scatter_bits<u16>", 1),
            (net.layers, valued, "scatter_rows<u16>", 0),
            (net.layers[1:], binary_256, "scatter_rows<u16>", 0)]  # first layer: CSR
    for layers, rows, scatter, bits in runs:
        backend.load_network(layers)
        log.clear()
        backend.load_features(rows, drop_empty=True)
        assert log == [scatter, "stamp"]
        assert int(backend._buffers.state[ST_INPUT_BITS]) == bits


def test_a_batch_end_is_planned_again_when_its_shape_or_buffers_change(backend_and_log,
                                                                     monkeypatch):
    """The gather that ends a batch and the copy behind it are kept from the last
    batch of the same shape (a small batch's timed part), and made again for another
    size or once the results' buffers were given back: a graph must never name an
    array that was freed."""
    from spdnn_mpi.backends.cuda import readback

    backend, log = backend_and_log
    rng = np.random.default_rng(5)
    net = random_network(rng, [64, 32, 10], 0.3)
    backend.load_network(net.layers)
    prepared = []
    prepare = readback.PackedResults.prepare
    monkeypatch.setattr(readback.PackedResults, "prepare",
                        lambda self, *a: prepared.append(a[-1]) or prepare(self, *a))

    def batch(n):
        rows = SparseRows.from_dense((rng.random((n, 64)) < 0.3).astype(np.float32))
        log.clear()
        backend.load_features(rows, drop_empty=False)
        for k in range(len(net.layers)):
            backend.run_layer(k, drop_dead=True)
        res = backend.finish(want_features=True)
        assert res.features.shape == (0, 10)
        return [x for x in log if x in ("capture(", "graph")]

    assert batch(100) == ["capture(", "graph"] and prepared == [100]
    assert batch(100) == ["graph"] and prepared == [100]  # kept: same shape, same arrays
    assert batch(40) == ["capture(", "graph"] and prepared == [100, 40]
    device = backend._results.device
    backend.release_buffers()
    assert batch(40) == ["capture(", "graph"] and prepared == [100, 40, 40]
    assert backend._results.device is not device
    assert backend._queue._finish_plan[2][1][-1] is backend._results.device


@pytest.mark.parametrize("ahead", [16, None])
def test_a_merge_runs_its_kernels_then_layers_run_on_the_held_rows(backend_and_log,
                                                                   monkeypatch, ahead):
    """``ahead``: a copy ahead shorter than the merge's positions, whose rest is read
    from the device after the wait, in order."""
    from spdnn_mpi.backends.cuda import merge

    if ahead is not None:
        monkeypatch.setattr(merge, "AHEAD_WORDS", ahead)
    backend, log = backend_and_log
    rng = np.random.default_rng(1)
    net = _network(rng)
    rows = SparseRows.from_dense((rng.random((50, 300)) < 0.2).astype(np.float32))
    backend.load_network(net.layers)
    backend.load_features(rows, drop_empty=True)
    backend.run_layer(0, drop_dead=True)
    backend.run_layer(1, drop_dead=True)
    log.clear()
    groups = backend.merge_duplicate_rows()  # the fake's kernels keep no row
    assert groups.rows_before == 50 and groups.representatives == 0
    np.testing.assert_array_equal(groups.members, np.arange(50))
    np.testing.assert_array_equal(groups.owners, np.arange(50, 100))
    assert log == ["capture(", "layer_group_sum<16>", "compact_rows",
                   "layer_csr<true,true,int>", ")", "graph", "compact_rows", "merge_clear",
                   "row_hashes", "hash_insert", "compare_heads", "mark_reps", "plan_reps",
                   "emit_groups", "compact_rows", "copy"]
    log.clear()
    backend.run_layer(2, drop_dead=True)
    backend.flush()
    # merging: captured for every number of rows held; 8 rows held now (nothing compacts)
    assert log == ["capture(", "layer_ell_smem<16,8,true>", ")",
                   "capture(", "layer_ell_smem<16,32,false>", ")",
                   "capture(", "layer_ell_smem<16,32,true>", ")",
                   "capture(", "layer_ell_smem<16,16,true>", ")", "graph"]
    assert backend.live_count() == 0


def _held_after_a_merge(backend, log, rows, n_layers):
    """Layer 0 on ``rows``, a merge (the fake's kernels keep no row: 8 held from
    there), then layers 1 .. ``n_layers`` - 1 in one flush, only theirs in ``log``."""
    backend.load_features(rows, drop_empty=True)
    backend.run_layer(0, drop_dead=True)
    backend.merge_duplicate_rows()
    log.clear()
    for k in range(1, n_layers):
        backend.run_layer(k, drop_dead=True)
    backend.flush()


def test_converged_shared_sum_layers_run_as_one_launch_a_run(backend_and_log):
    """Once rows are held, consecutive uniform grouped layers of one degree are one
    layers_held_row launch, a block a row held (a run of one, or whole tiles, the
    layer's own kernel)."""
    backend, log = backend_and_log
    rng = np.random.default_rng(2)
    same = [block_layer(rng, 256, 256, 16, values=False, min_group=16) for _ in range(4)]
    general = random_network(rng, [256, 256], 0.05).layers[0]
    net = Network([same[0], same[1], same[2], general, same[3]])
    rows = SparseRows.from_dense((rng.random((50, 256)) < 0.2).astype(np.float32))
    backend.load_network(net.layers)
    _held_after_a_merge(backend, log, rows, 5)
    held8 = ["layers_held_row<16>", "layer_csr4<true,true>", "layer_group_sum<16>"]
    assert log[:5] == ["capture(", *held8, ")"]
    whole = log[log.index("capture(", 1):].copy()  # the whole-tile form, captured next
    assert whole[1] == "layer_group_sum<16>" and "layers_held_row" not in whole[2]
    assert log[-1] == "graph"
    assert log.count("layers_held_row<16>") == 3  # 8, 16 and 32 rows held
    assert log.cooperative == []


def test_a_compile_is_seen_in_cupys_cache_folder(monkeypatch, tmp_path):
    """Whether NVRTC ran is read off CuPy's cache folder: its own answer where CuPy
    gives one, else CUPY_CACHE_DIR; a file added below the folder is a compile."""
    from spdnn_mpi.backends.cuda import compile as comp

    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "env"))
    bare = types.SimpleNamespace(cuda=types.SimpleNamespace())  # no cuda.compiler
    assert comp._cache_files(bare) == frozenset()  # no folder yet: nothing cached
    before = comp._cache_files(bare)
    (tmp_path / "env" / "sub").mkdir(parents=True)
    (tmp_path / "env" / "sub" / "k.cubin").write_bytes(b"x")
    assert comp._cache_files(bare) != before
    told = types.SimpleNamespace(cuda=types.SimpleNamespace(compiler=types.SimpleNamespace(
        get_cache_dir=lambda: str(tmp_path / "own"))))
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "a.cubin").write_bytes(b"x")
    assert comp._cache_files(told) == frozenset({"a.cubin"})


def _network_on_fake_device(backend, layers):
    """The backend's held-layer runs and layer entries of ``layers`` (fake device)."""
    backend.load_network(layers)
    net = backend._network
    return net.held, net.layers


def test_runs_are_consecutive_shared_sum_layers_of_one_degree(backend_and_log):
    rng = np.random.default_rng(3)
    d32 = block_layer(rng, 256, 256, 32, values=False, min_group=16)
    d16 = block_layer(rng, 256, 256, 16, values=False, min_group=16)
    weighted = block_layer(rng, 256, 256, 16)
    layers = [d32, d32, d32, d16, d16, weighted, d32]
    runs, entries = _network_on_fake_device(backend_and_log[0], layers)
    assert [e.plan.kernel for e in entries][:6] == ["layer_group_sum<32>"] * 3 + [
        "layer_group_sum<16>"] * 2 + ["layer_group<16>"]
    todo = [(k, True) for k in range(len(layers))]
    assert [runs.run_length(todo, i) for i in range(len(todo))] == [3, 2, 1, 2, 1, 1, 1]
    gap = [(0, True), (1, True), (3, True), (4, True)]  # layer 2 ran in an earlier piece
    assert [runs.run_length(gap, i) for i in range(len(gap))] == [2, 1, 2, 1]
    # 16 groups of 256 outputs, a block a row held: a thread a group, one warp
    assert [runs.threads(0, 3, held) for held in (8, 16, 32)] == [32, 32, 32]


def test_layers_wider_than_a_row_block_carries_run_over_the_card(backend_and_log,
                                                                 monkeypatch):
    """Layers wider than held.ROW_MAX_WIDTH run over the card, one block an SM
    launched cooperatively: as a flow (layers_held_flow) where each layer before a
    run's last stores one value a group, else in layers_held_grid; a run never mixes
    the row form with these, and a network of only wide layers compiles no row form."""
    backend, log = backend_and_log
    rng = np.random.default_rng(5)
    wide = block_layer(rng, 256, 256, 16, values=False, min_group=16)
    narrow = block_layer(rng, 128, 128, 16, values=False, min_group=16)
    monkeypatch.setattr(held, "ROW_MAX_WIDTH", 200)
    runs, _ = _network_on_fake_device(backend, [narrow, narrow, wide, wide, narrow])
    todo = [(k, True) for k in range(5)]
    assert [runs.run_length(todo, i) for i in range(5)] == [2, 1, 2, 1, 1]
    # 16 groups over 132 blocks: a warp a block; a block a row: a thread a group
    assert [runs.threads(2, 2, held_rows) for held_rows in (8, 16, 32)] == [32, 32, 32]
    assert [runs.threads(0, 2, held_rows) for held_rows in (8, 16, 32)] == [32, 32, 32]
    backend.load_network([wide] * 4)
    with pytest.raises(KeyError, match="layers_held_row<16> was not among"):
        backend._network.module.get_function("layers_held_row<16>")
    rows = SparseRows.from_dense((rng.random((50, 256)) < 0.2).astype(np.float32))
    _held_after_a_merge(backend, log, rows, 4)
    assert log[:3] == ["capture(", "layers_held_flow<16>", ")"]
    assert log.cooperative[0] == ("layers_held_flow<16>", (PROPS["multiProcessorCount"],))
    assert runs.flows(2, 2, 8) and not runs.flows(0, 2, 8)  # the row form never flows
    assert backend._network.held.flows(1, 3, 8) and not backend._network.held.flows(1, 1, 8)
    monkeypatch.setattr(held, "FLOW_MIN_LAYERS", 1 << 30)
    backend.load_network([wide] * 4)
    _held_after_a_merge(backend, log, rows, 4)
    assert log[:3] == ["capture(", "layers_held_grid<16>", ")"]
    monkeypatch.setattr(held, "FLOW_MIN_LAYERS", 2)
    # a bias a neuron: the layer stores each slot, so the run does not flow
    vector = block_layer(rng, 256, 256, 16, values=False, min_group=16)
    vector.bias = rng.uniform(-0.2, 0.05, 256).astype(np.float32)
    backend.load_network([wide, wide, vector, wide])
    assert not backend._network.held.flows(1, 3, 8) and backend._network.held.flows(1, 2, 8)
    _held_after_a_merge(backend, log, rows, 4)
    assert log[:3] == ["capture(", "layers_held_grid<16>", ")"]


def test_settled_layers_over_every_tile_run_many_a_launch(backend_and_log, monkeypatch):
    """From held.RUN_FIRST_LAYER on, consecutive uniform grouped layers of one degree
    run held.RUN_MAX_LAYERS at most in one cooperative layers_run_grid launch over
    every tile (two blocks an SM where they fit), each run after the compaction pass
    its layer before may ask for, and before one where the next layer does not compact
    on write; layers before that, other kernels and wider layers a launch a layer."""
    backend, log = backend_and_log
    monkeypatch.setattr(held, "RUN_FIRST_LAYER", 2)
    monkeypatch.setattr(held, "RUN_MAX_LAYERS", 3)
    rng = np.random.default_rng(7)
    same = block_layer(rng, 256, 256, 16, values=False, min_group=16)
    general = random_network(rng, [256, 256], 0.05).layers[0]
    wide = block_layer(rng, 256, 256, 32, values=False, min_group=16)
    layers = [same] * 7 + [general, same, same, wide, wide]
    monkeypatch.setattr(held, "RUN_MAX_WIDTH", 256)
    from spdnn_mpi.backends.cuda import layout as lay

    writes = lay.compacts_on_write  # as if layer 7's kernel needed compact_rows before it
    monkeypatch.setattr(lay, "compacts_on_write", lambda kind: kind != "csr4_smem"
                        and writes(kind))
    backend.load_network(layers)
    assert "layers_run_grid<16>" in backend._network.module._parts[0][1]
    rows = SparseRows.from_dense((rng.random((70, 256)) < 0.2).astype(np.float32))
    backend.load_features(rows, drop_empty=True)
    log.clear()
    for k in range(len(layers)):
        backend.run_layer(k, drop_dead=True)
    backend.flush()
    run = ["compact_rows", "layers_run_grid<16>"]
    body = log[log.index("capture(") + 1:log.index(")")]
    assert body == ["layer_group_sum<16>"] * 2 + run + run + [  # layers 2-4, then 5-6
        "compact_rows", "layer_csr4<true,true>", *run, "compact_rows", "layers_run_grid<32>"]
    grid = (2 * PROPS["multiProcessorCount"],)
    assert log.cooperative == [("layers_run_grid<16>", grid)] * 3 + [
        ("layers_run_grid<32>", grid)]


def test_before_cc_9_converged_layers_keep_one_launch_a_layer(backend_and_log,
                                                              monkeypatch):
    """Before compute capability 9.0 (where the one-launch forms were never measured):
    no one-launch form is compiled, and held rows run each layer's own kernel."""
    monkeypatch.setitem(PROPS, "major", 8)
    backend, log = backend_and_log
    rng = np.random.default_rng(6)
    same = [block_layer(rng, 256, 256, 16, values=False, min_group=16) for _ in range(3)]
    rows = SparseRows.from_dense((rng.random((50, 256)) < 0.2).astype(np.float32))
    backend.load_network(same)
    assert backend._network.held is None
    with pytest.raises(KeyError, match="layers_held_row<16> was not among"):
        backend._network.module.get_function("layers_held_row<16>")
    _held_after_a_merge(backend, log, rows, 3)
    assert log[:4] == ["capture(", "layer_group_sum<16>", "layer_group_sum<16>", ")"]


def test_one_launch_blocks_have_the_warps_the_widest_layers_groups_fill(backend_and_log,
                                                                        monkeypatch):
    rng = np.random.default_rng(5)
    wide = block_layer(rng, 4096, 4096, 32, values=False, min_group=16)  # 256 groups
    narrow = block_layer(rng, 4096, 1024, 32, values=False, min_group=16)  # 64 groups
    runs, _entries = _network_on_fake_device(backend_and_log[0], [wide, wide, narrow])
    # a block a row held: a thread a group of the widest layer, whatever the rows held
    assert [runs.threads(0, 3, held) for held in (8, 16, 32)] == [256, 256, 256]
    assert [runs.threads(2, 1, held) for held in (8, 16, 32)] == [64, 64, 64]
    monkeypatch.setattr(held, "ROW_MAX_WIDTH", 0)
    monkeypatch.setitem(PROPS, "multiProcessorCount", 8)
    runs, _entries = _network_on_fake_device(backend_and_log[0], [wide, wide, narrow])
    # over the card (8 SMs): 256 groups are 16, 32 or 64 warp steps for 8, 16 or 32 rows
    # (four rows a lane); a flow's lane takes two, so twice the steps, where those
    # fit the card's 8 x 8 warps at once (not 128 steps for 32 rows: 4.4 against 3.0 us
    # a layer at 65536 wide)
    assert [runs.threads(0, 3, held) for held in (8, 16, 32)] == [128, 256, 256]
    assert [runs.flows(0, 3, held) for held in (8, 16, 32)] == [True, True, False]
    assert [runs.threads(2, 1, held) for held in (8, 16, 32)] == [32, 32, 64]
    monkeypatch.setattr(held, "FLOW_MIN_LAYERS", 1 << 30)
    assert [runs.threads(0, 3, held) for held in (8, 16, 32)] == [64, 128, 256]


def test_table_rows_point_at_each_layers_groups_and_carry_its_epilogue(backend_and_log):
    rng = np.random.default_rng(4)
    plain = block_layer(rng, 256, 256, 32, values=False, min_group=16, bias=-0.25)
    biased = block_layer(rng, 256, 256, 32, values=False, min_group=16)
    biased.bias = rng.normal(size=256).astype(np.float32)
    weighted = block_layer(rng, 256, 256, 16)
    runs, entries = _network_on_fake_device(backend_and_log[0], [plain, biased, weighted])
    rows = np.asarray(runs.table).view(held.HELD_LAYER_DTYPE)
    n_groups, gidx, gout = entries[0].extra_held[:3]
    assert rows[0]["gidx"] == gidx.data.ptr and rows[0]["gout"] == gout.data.ptr
    assert rows[0]["n_groups"] == n_groups and rows[0]["n_out"] == 256
    assert rows[0]["bias_v"] == 0 and rows[0]["bias_s"] == np.float32(-0.25)
    assert rows[0]["scale"] == np.float32(plain.uniform_value) and rows[0]["clip"] == 32
    assert rows[1]["bias_v"] == entries[1].head[4].data.ptr
    assert rows[2]["gidx"] == 0  # not a shared-sum layer: never read


def test_later_layers_of_a_run_read_the_groups_of_the_layer_before(backend_and_log):
    """A held run's layer after one of its form with one bias reads its inputs as that
    layer's groups (which then stores one value a group): their ids are made by two
    launches when the network loads; after a layer with a bias vector, as neurons."""
    backend, log = backend_and_log
    rng = np.random.default_rng(5)
    layers = [block_layer(rng, 256, 256, 16, values=False, min_group=16) for _ in range(4)]
    layers[1].bias = np.full(256, -0.1, dtype=np.float32)  # a vector: layer 2 reads neurons
    layers.append(block_layer(rng, 256, 256, 32, values=False, min_group=16))  # other degree
    backend.load_network(layers)
    assert backend.describe()["kernel_names"] == {"layer_group_sum<16>": 4,
                                                  "layer_group_sum<32>": 1}
    table = np.asarray(backend._network.held.table).view(held.HELD_LAYER_DTYPE)
    assert [bool(p) for p in table["gidx_grp"]] == [False, True, False, True, False]
    assert log.count("held_group_of") == 1 and log.count("held_group_inputs") == 1
    # the ids of layers 1 and 3, back to back: as many as their groups hold
    assert table["gidx_grp"][3] - table["gidx_grp"][1] == 2 * 16 * table["n_groups"][1]
