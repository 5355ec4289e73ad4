"""CUDA backend against the scipy reference (GPU tests), and its source lookup (anywhere).

The GPU tests are marked ``gpu`` and skip with the reason where CuPy or a
device is missing (``spdnn_mpi.backends.cuda_available``).
"""

from __future__ import annotations

import os
import types
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import random_network

from spdnn_mpi.backends import cuda_available
from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Layer, Network, SparseRows
from spdnn_mpi.reference import reference_infer


def _cuda_status() -> tuple[bool, str]:
    """cuda_available() after the backend's own CuPy import, which also works from a
    checkout whose cuda/ folder would hide NVIDIA's ``cuda`` package."""
    from spdnn_mpi.backends.cuda.backend import import_cupy
    from spdnn_mpi.errors import SpdnnError

    try:
        import_cupy()
    except SpdnnError as exc:
        return False, str(exc)
    return cuda_available()


CUDA_OK, CUDA_WHY = _cuda_status()
needs_gpu = pytest.mark.skipif(not CUDA_OK, reason=CUDA_WHY)


# -- anywhere: sources and layouts ------------------------------------------------
def test_kernel_sources_found_and_assembled():
    folder = lay.kernel_source_dir()
    for name in lay.KERNEL_HEADERS + lay.KERNEL_UNITS:
        assert folder.joinpath(name).is_file(), name
    from spdnn_mpi.backends.cuda.config import KernelConfig

    config = KernelConfig(smem_threads=256)
    src = lay.assemble_source(config)
    assert src.startswith(config.define_block()) and "#define SPDNN_SMEM_THREADS 256\n" in src
    assert '#include "' not in src  # local headers inlined, so NVRTC needs no -I
    for kernel in ("layer_ell_smem", "layer_ell_global", "layer_csr", "layer_group", "compact_rows",
                   "scatter_rows", "stamp"):
        assert f" {kernel}(" in src or f"\n    {kernel}(" in src, kernel
    assert "#pragma once" not in src and src.count("struct LayerArgs {") == 1


def test_installed_package_maps_to_cuda_folder():
    """setup.cfg ships cuda/*.cu and *.cuh as package spdnn_mpi.kernels."""
    text = (Path(__file__).resolve().parents[1] / "setup.cfg").read_text()
    assert "spdnn_mpi.kernels = cuda" in text
    assert "*.cu" in text and "*.cuh" in text


def _fixed_degree_layer(rng, n_in, n_out, degree, *, bias=-0.3, clip=32.0, value=1 / 16):
    idx = np.sort(np.stack([rng.choice(n_in, degree, replace=False) for _ in range(n_out)]),
                  axis=1)
    indptr = np.arange(0, degree * n_out + 1, degree, dtype=np.int64)
    return Layer(n_in, n_out, indptr, idx.ravel().astype(np.uint16), None, value, bias, clip)


@pytest.mark.parametrize("n_in,n_out,kind", [(300, 64, "smem32"), (300, 33, "global"),
                                             (9000, 70, "global")])
def test_ell_layout_covers_every_output_once(n_in, n_out, kind):
    rng = np.random.default_rng(n_out)
    layer = _fixed_degree_layer(rng, n_in, n_out, 16)
    plan = lay.plan_layer(layer, 200 * 1024, "smem32" if kind == "smem32" else "global")
    assert plan.kind == kind and plan.is_ell
    flat, out_ids = lay.ell_layout(layer)
    assert flat.dtype == np.uint16 and out_ids.dtype == np.int32
    assert np.array_equal(np.sort(out_ids), np.arange(n_out))  # a permutation
    back = np.empty((n_out, 16), dtype=np.uint16)
    back[out_ids] = flat.reshape(n_out, 16)
    assert np.array_equal(back.ravel(), layer.indices)  # CSR order kept within each output


def _block_layer(rng, n_in, n_out, degree, *, values=True, max_group=16, bias=-0.3,
                 clip=32.0, min_group=1):
    """Outputs in groups (random sizes from ``min_group`` to ``max_group``, scattered
    over the output ids) that read the same ``degree`` inputs; random values per nonzero."""
    sizes = []
    while sum(sizes) < n_out:
        sizes.append(int(rng.integers(min_group, max_group + 1)))
    sizes[-1] -= sum(sizes) - n_out
    sets = [np.sort(rng.choice(n_in, degree, replace=False)) for _ in sizes]
    rows = np.concatenate([np.repeat(s[None], k, axis=0) for s, k in zip(sets, sizes)])
    rows = rows[rng.permutation(n_out)]
    indptr = np.arange(0, degree * n_out + 1, degree, dtype=np.int64)
    vals = rng.normal(0.2, 0.4, degree * n_out).astype(np.float32) if values else None
    return Layer(n_in, n_out, indptr, rows.ravel().astype(np.uint16), vals,
                 None if values else 1 / 16, bias, clip)


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("n_in,n_out,degree,max_group", [(300, 203, 32, 16), (5000, 77, 8, 40),
                                                          (64, 1000, 64, 3)])
def test_group_layout_covers_every_output_once(n_in, n_out, degree, max_group, values):
    rng = np.random.default_rng(n_out + degree)
    layer = _block_layer(rng, n_in, n_out, degree, values=values, max_group=max_group)
    assert lay.plan_layer(layer, 200 * 1024).kind == "group"
    gl = lay.group_layout(layer)
    assert gl.n_groups % 4 == 0
    out = gl.out_ids.reshape(gl.n_groups, lay.GROUP_SLOTS)
    idx = gl.indices.reshape(gl.n_groups, degree)
    assert np.array_equal(np.sort(out[out >= 0]), np.arange(n_out))  # each output once
    rows = layer.indices.reshape(n_out, degree)
    g, slot = np.nonzero(out >= 0)
    assert np.array_equal(idx[g], rows[out[g, slot]])  # every member reads the group's inputs
    if values:
        w = gl.weights.reshape(gl.n_groups, degree, lay.GROUP_SLOTS)
        assert gl.wstride == degree * lay.GROUP_SLOTS
        assert np.array_equal(w[g, :, slot], layer.values.reshape(n_out, degree)[out[g, slot]])
        assert np.all(w.transpose(0, 2, 1)[out < 0] == 0)
    else:
        assert gl.wstride == 0 and np.all(gl.weights == 1) and gl.weights.size == degree * 16
    n_sets = len(np.unique(rows, axis=0))
    used = int(np.count_nonzero((out >= 0).any(axis=1)))
    assert n_sets <= used <= n_sets + n_out // lay.GROUP_SLOTS  # runs cut at 16 only
    assert gl.fill == pytest.approx(n_out / (used * lay.GROUP_SLOTS))


@pytest.mark.parametrize("values", [True, False])
def test_ell_from_groups_is_an_ell_layout(values):
    rng = np.random.default_rng(9)
    layer = _block_layer(rng, 400, 333, 16, values=values, max_group=20)
    idx, out_ids = lay.ell_from_groups(lay.group_layout(layer), 16)
    assert np.array_equal(np.sort(out_ids), np.arange(333))
    assert np.array_equal(idx.reshape(333, 16), layer.indices.reshape(333, 16)[out_ids])


def test_group_layout_of_radixnet_layers_is_full():
    """RadiX-Net layers (the challenge's) are groups of 16 outputs sharing 32 inputs."""
    from spdnn_mpi.generators.radixnet import radixnet_network

    for layer in radixnet_network(1024, 3).layers:
        gl = lay.group_layout(layer)
        assert gl.fill == 1.0 and gl.n_groups == 1024 // 16


def test_plan_takes_group_only_for_fixed_degree_16_bit_layers():
    rng = np.random.default_rng(4)
    uniform = _fixed_degree_layer(rng, 300, 64, 16)
    assert lay.plan_layer(uniform, 200 * 1024).kind == "group"
    assert lay.plan_layer(uniform, 200 * 1024, grouped=False).kind == "smem32"
    assert lay.plan_layer(uniform, 200 * 1024, "csr").kind == "csr_smem"
    odd = _fixed_degree_layer(rng, 300, 64, 12)
    assert lay.plan_layer(odd, 200 * 1024, "group").kind == "csr4_smem"


@pytest.mark.parametrize("values", [True, False])
def test_csr4_layout_aligns_each_output_and_keeps_csr_order(values):
    rng = np.random.default_rng(11)
    i, j = np.nonzero(rng.random((70, 45)) < 0.2)
    vals = rng.normal(size=len(i)) if values else np.full(len(i), 0.5)
    layer = Layer.from_coo(i, j, vals, 70, 45)
    assert lay.plan_layer(layer, 200 * 1024).kind == "csr4_smem"
    assert lay.plan_layer(layer, 1024).kind == "csr4_global"
    assert lay.plan_layer(layer, 200 * 1024, "global").kind == "csr4_global"
    assert lay.plan_layer(layer, 200 * 1024, "csr").kind == "csr_smem"
    narrow = Layer.from_coo(i % 16, j % 16, vals, 70, 16)
    assert lay.plan_layer(narrow, 200 * 1024).kind == "csr4_global"
    assert lay.plan_layer(narrow, 200 * 1024, "smem32").kind == "csr4_smem"
    spans, idx, v = lay.csr4_layout(layer)
    deg = np.diff(layer.indptr)
    assert np.array_equal(spans[:, 1], deg) and np.all(spans[:, 0] % 8 == 0)
    assert np.all(np.diff(spans[:, 0]) == -(-deg[:-1] // 8) * 8)
    for out in range(layer.n_out):
        a, b = layer.indptr[out], layer.indptr[out + 1]
        start, d = spans[out]
        assert np.array_equal(idx[start:start + d], layer.indices[a:b])
        assert np.all(idx[start + d:start + -(-d // 8) * 8] == 0)
        if values:
            assert np.array_equal(v[start:start + d], layer.values[a:b])
    if not values:
        assert v.size == 1


class _FakeKernel:
    def __init__(self, name):
        self.name, self.num_regs, self.shared_size_bytes = name, 80, 0
        self.max_dynamic_shared_size_bytes = 0


class _FakeModule:
    """Kernels by name; one object a name, as the driver keeps one function (and its
    attributes) a name in a module."""

    def __init__(self):
        self.kernels = {}

    def get_function(self, name):
        return self.kernels.setdefault(name, _FakeKernel(name))


def test_shared_memory_limit_of_a_kernel_is_only_raised():
    """Two staged layers of the same kernel: the second, smaller, must not lower
    the limit the first needs (CUDA_ERROR_INVALID_VALUE at its launch)."""
    rng = np.random.default_rng(5)
    limit = 227 * 1024
    launcher = _planning_launcher()
    wide, narrow = (random_network(rng, [n_in, 40], 0.1).layers[0] for n_in in (644, 533))
    for layer in (wide, narrow):
        entry = launcher.layer_entry(layer, lay.plan_layer(layer, limit), limit)
        assert entry.plan.kind == "csr4_smem"
    assert entry.full.kern.max_dynamic_shared_size_bytes == 644 * 128


def _planning_launcher():
    """The launch planning of the CUDA backend with NumPy layouts and kernels by name."""
    from spdnn_mpi.backends.cuda.config import KernelConfig
    from spdnn_mpi.backends.cuda.launch import Launcher

    return Launcher(np, _FakeModule(), KernelConfig(), 132, "auto",
                    lambda kern, threads, smem: 2)


@pytest.mark.parametrize("n,held_kernel", [(1024, "layer_ell_smem"), (4096, "layer_ell_global")])
def test_converged_uniform_grouped_layers_launch_the_few_row_ell_kernels(n, held_kernel):
    """Direct layers on the grouped kernel; once one tile is held, the ELL kernels for
    8/16/32 rows with the ELL layout (their sums are the grouped kernel's)."""
    from spdnn_mpi.generators.radixnet import radixnet_network

    limit = 227 * 1024
    layer = radixnet_network(n, 1).layers[0]
    entry = _planning_launcher().layer_entry(layer, lay.plan_layer(layer, limit), limit)
    assert entry.full.kern.name == "layer_group_sum<32>" and entry.plan.kind == "group"
    for rows, (kern, grid, threads, smem) in entry.small.items():
        assert kern.name == f"{held_kernel}<32,{rows},true>" and grid >= 1
        assert threads == (512 if held_kernel == "layer_ell_smem" else 256)
        assert smem == (n * 32 * 4 if held_kernel == "layer_ell_smem" else 0)
    idx, out_ids = entry.extra_held
    assert idx.dtype == np.uint16 and out_ids.dtype == np.int32
    assert np.array_equal(np.sort(out_ids), np.arange(n))  # every output once
    rows = layer.indices.reshape(n, 32)
    assert np.array_equal(idx.reshape(n, 32), rows[out_ids])  # its own inputs, CSR order


def test_uniform_grouped_layers_take_the_shared_sum_form():
    """One weight for every edge: a group's slots share one sum (layer_group_sum);
    per-edge values keep every slot's own sum (layer_group)."""
    from spdnn_mpi.generators.radixnet import radixnet_network

    limit = 227 * 1024
    layer = radixnet_network(1024, 1).layers[0]
    values = np.random.default_rng(1).normal(size=layer.nnz).astype(np.float32)
    valued = Layer(layer.n_in, layer.n_out, layer.indptr, layer.indices, values, None, -0.3)
    for case, want in [(layer, "layer_group_sum<32>"), (valued, "layer_group<32>")]:
        entry = _planning_launcher().layer_entry(case, lay.plan_layer(case, limit), limit)
        assert entry.plan.kind == "group" and entry.full.kern.name == want


@pytest.mark.parametrize("n_in,kind,kernel", [(300, "csr4_smem", "layer_csr4<true,true>"),
                                               (3000, "csr4_global", "layer_csr4<false,true>"),
                                               (70000, "csr_global", "layer_csr<false,true,int>")])
def test_launch_of_general_layers(n_in, kind, kernel):
    rng = np.random.default_rng(n_in)
    i = rng.integers(0, n_in, 400)
    j = rng.integers(0, 50, 400)
    layer = Layer.from_coo(i, j, rng.normal(size=400), n_in, 50)
    limit = 227 * 1024
    entry = _planning_launcher().layer_entry(layer, lay.plan_layer(layer, limit), limit)
    assert entry.plan.kind == kind and entry.full.kern.name == kernel
    assert entry.extra_held is entry.extra and len(entry.extra) == 3
    assert {launch.kern.name for launch in entry.small.values()} == {kernel}
    assert entry.form(0) == (entry.full, entry.extra)
    assert entry.form(16) == (entry.small[16], entry.extra_held)
    assert entry.full.smem == entry.plan.smem_bytes
    assert entry.layout_bytes == sum(a.nbytes for a in entry.keep) > 0


def test_converged_grouped_layers_with_values_stay_on_the_grouped_kernel():
    from spdnn_mpi.generators.radixnet import radixnet_network

    limit = 227 * 1024
    base = radixnet_network(1024, 1).layers[0]
    values = np.random.default_rng(0).normal(size=base.nnz).astype(np.float32)
    layer = Layer(base.n_in, base.n_out, base.indptr, base.indices, values, None, -0.3, 32.0)
    entry = _planning_launcher().layer_entry(layer, lay.plan_layer(layer, limit), limit)
    assert {launch.kern.name for launch in entry.small.values()} == {"layer_group<32>"}
    assert entry.extra_held[:5] == entry.extra[:5] and entry.extra_held[-1] == 1


def test_compaction_pass_only_before_kernels_that_cannot_write_it():
    """The layer loop launches compact_rows after a layer that may drop rows only
    when the next layer's kernel does not compact on write (the general CSR); after
    the last layer a compaction stays pending (finish reads the mask)."""
    import contextlib

    from spdnn_mpi.backends.cuda.launch import Launch, LayerLaunch
    from spdnn_mpi.backends.cuda.layer_queue import LayerQueue

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


def test_locality_order_puts_equal_input_sets_side_by_side():
    rng = np.random.default_rng(3)
    base = np.sort(np.stack([rng.choice(5000, 32, replace=False) for _ in range(50)]), axis=1)
    rows = base[rng.permutation(np.repeat(np.arange(50), 16))]  # 16 outputs per input set
    order = lay.locality_order(rows)
    runs = rows[order]
    changes = np.count_nonzero(np.any(runs[1:] != runs[:-1], axis=1))
    assert changes == 49  # each input set is one run of 16
    assert np.array_equal(np.sort(order), np.arange(len(rows)))


def test_unknown_variant_is_refused():
    from spdnn_mpi.errors import SpdnnError

    layer = _fixed_degree_layer(np.random.default_rng(4), 100, 20, 8)
    with pytest.raises(SpdnnError, match="unknown CUDA kernel variant 'smem8'"):
        lay.plan_layer(layer, 200 * 1024, "smem8")
    with pytest.raises(SpdnnError, match="one of auto, group, smem32, global, csr"):
        _backend(variant="l1")  # refused before CuPy is needed, so also without a GPU


def test_plan_falls_back_to_csr_for_general_layers():
    rng = np.random.default_rng(2)
    i, j = np.nonzero(rng.random((40, 30)) < 0.3)
    layer = Layer.from_coo(i, j, rng.normal(size=len(i)), 40, 30)
    plan = lay.plan_layer(layer, 200 * 1024)
    assert plan.kind.startswith("csr")


# -- GPU ----------------------------------------------------------------------------
def _backend(**kw):
    from spdnn_mpi.backends.cuda.backend import CudaBackend

    return CudaBackend(**kw)


def _check(network, rows, backend=None, *, batch=None, features=True):
    """Run on the GPU and compare ids (exactly) and features (1e-5 relative)."""
    backend = backend or _backend()
    backend.load_network(network.layers)
    res = run_inference(network, rows, backend, batch=batch, want_features=features)
    ids, ref = reference_infer(network, rows)
    assert np.array_equal(res.alive_ids, ids)
    if features:
        assert res.features.shape == ref.shape
        if ref.size:
            err = np.linalg.norm(res.features - ref) / max(np.linalg.norm(ref), 1e-30)
            assert err <= 1e-5, err
    return res


def _random_network(rng, widths, *, values=True, bias="scalar", clip=32.0, density=0.2):
    layers = []
    for n_in, n_out in zip(widths[:-1], widths[1:]):
        i, j = np.nonzero(rng.random((n_in, n_out)) < density)
        vals = rng.normal(0.3, 0.5, len(i)) if values else np.full(len(i), 0.25)
        if bias == "scalar":
            b = float(-rng.uniform(0.05, 0.5))
        elif bias == "vector":
            b = rng.uniform(-0.6, 0.05, n_out).astype(np.float32)
        else:  # some positive: rows may come back, nothing is dropped
            b = rng.uniform(-0.3, 0.3, n_out).astype(np.float32)
        layers.append(Layer.from_coo(i, j, vals, n_in, n_out, bias=b, clip=clip))
    return Network(layers)


def _random_rows(rng, n_rows, n_cols, density=0.1, binary=True):
    dense = (rng.random((n_rows, n_cols)) < density).astype(np.float32)
    if not binary:
        dense *= rng.uniform(0.1, 2.0, dense.shape).astype(np.float32)
    return SparseRows.from_dense(dense)


@pytest.mark.parametrize(
    "widths,values,bias,clip",
    [
        ([50, 70, 40, 90], True, "scalar", 32.0),
        ([64, 64, 64, 64, 64], True, "vector", None),
        ([30, 100, 20], True, "positive", 2.0),
        ([128, 96, 128], False, "scalar", None),
        ([3000, 200, 2500], True, "vector", 32.0),  # wide layers: CSR through L1/L2
    ],
)
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.gpu
@needs_gpu
def test_random_networks_match_reference(widths, values, bias, clip, binary):
    rng = np.random.default_rng(zlib.crc32(repr((widths, values, bias, binary)).encode()))
    net = _random_network(rng, widths, values=values, bias=bias, clip=clip)
    rows = _random_rows(rng, 150, widths[0], 0.15, binary)
    _check(net, rows)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", ["auto", "group", "smem32", "global", "csr"])
@pytest.mark.parametrize("degree", [8, 32, 64])
@pytest.mark.parametrize("widths", [[512, 512, 512, 512], [300, 1001, 203, 701]])
def test_fixed_degree_uniform_layers_every_kernel(variant, degree, widths):
    """Odd widths leave the last warp step of a tile partly empty; 700 rows span
    22 tiles, so block ranges start and end inside tiles."""
    rng = np.random.default_rng(len(widths) * 7 + widths[1] + degree)
    layers = []
    for n_in, n_out in zip(widths[:-1], widths[1:]):
        bias = rng.uniform(-0.5, 0.0, n_out).astype(np.float32) if n_out % 2 else -0.25
        value = float(rng.uniform(0.05, 0.3))
        layers.append(_fixed_degree_layer(rng, n_in, n_out, degree, bias=bias, value=value))
    net = Network(layers)
    rows = _random_rows(rng, 700, widths[0], 0.3, binary=False)
    _check(net, rows, _backend(variant=variant))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("widths,degree,max_group", [([512, 512, 512, 512], 32, 16),
                                                     ([300, 1001, 203, 701], 16, 16),
                                                     ([2000, 3000, 70], 64, 40),
                                                     ([256, 256, 256], 8, 5)])
def test_grouped_kernel_on_block_sparse_networks(widths, degree, max_group, values,
                                                 monkeypatch):
    """Block-sparse layers (outputs sharing their inputs, groups of random size
    scattered over the output ids, random values and biases, odd widths) on the
    grouped kernel: ids exact, features within 1e-5 of the reference; uniform
    layers bit for bit (their sums are the other kernels' sums)."""
    rng = np.random.default_rng(zlib.crc32(repr((widths, degree, values)).encode()))
    layers = []
    for n_in, n_out in zip(widths[:-1], widths[1:]):
        bias = rng.uniform(-0.5, 0.05, n_out).astype(np.float32) if n_out % 2 else -0.2
        layers.append(_block_layer(rng, n_in, n_out, degree, values=values,
                                   max_group=max_group, bias=bias))
    net = Network(layers)
    rows = _random_rows(rng, 900, widths[0], 0.3, binary=False)
    backend = _backend(variant="group")
    res = _check(net, rows, backend)
    assert backend.describe()["kernels"] == {"group": len(layers)}
    if not values:
        _, ref = reference_infer(net, rows)
        assert np.array_equal(res.features, ref)
    # 16 slots a lane and warps taking 4 steps in a row: another split, the same sums
    from spdnn_mpi.backends.cuda import launch
    from spdnn_mpi.backends.cuda.config import KernelConfig

    monkeypatch.setattr(launch, "GROUP_CHUNK", 4)
    plain = _backend(variant="group",
                     config=KernelConfig(group_lane_slots=16, group_min_blocks=2))
    plain.load_network(net.layers)
    again = run_inference(net, rows, plain, want_features=True)
    assert np.array_equal(again.alive_ids, res.alive_ids)
    assert np.array_equal(again.features, res.features)


def _dying_mixed_network(rng) -> tuple[Network, SparseRows]:
    """Six layers of every kernel kind, with inputs of seven densities so rows die
    layer after layer: compactions before a kernel that cannot write them (the
    general CSR), written by the grouped, CSR4 and ELL kernels, and (cut after
    five layers) one left pending at the end."""
    def general(n_in, n_out, density, itype, bias):
        i, j = np.nonzero(rng.random((n_in, n_out)) < density)
        layer = Layer.from_coo(i, j, rng.normal(0.3, 0.5, len(i)), n_in, n_out, bias=bias,
                               clip=32.0)
        layer.indices = layer.indices.astype(itype)  # int32: the general CSR kernel
        return layer

    def bias(n, lo=-0.9, hi=-0.1):
        return rng.uniform(lo, hi, n).astype(np.float32)

    net = Network([
        _block_layer(rng, 3000, 512, 32, bias=bias(512, -2.5, -1.0), min_group=16),  # group
        general(512, 3000, 0.02, np.int32, bias(3000)),  # csr_smem
        _fixed_degree_layer(rng, 3000, 512, 16, bias=bias(512), value=0.2),  # ELL global
        _block_layer(rng, 512, 700, 16, values=False, bias=bias(700), min_group=16),  # group
        general(700, 512, 0.05, np.uint16, bias(512)),  # csr4_smem
        _fixed_degree_layer(rng, 512, 300, 32, bias=bias(300), value=0.12),  # ELL smem
    ])
    parts = [_random_rows(rng, 300, 3000, d) for d in (0.0015, 0.005, 0.01, 0.02, 0.04, 0.08)]
    parts.append(_random_rows(rng, 200, 3000, 0.3))
    return net, SparseRows(3000, np.concatenate([[0], *(p.indptr[1:] + sum(
        q.indptr[-1] for q in parts[:i]) for i, p in enumerate(parts))]),
        np.concatenate([p.indices for p in parts]))


def _compactions_expected(live: list[int], n_rows: int) -> int:
    """Compactions the plan's rule (SPDNN_COMPACT_DIV = 10) makes for these live counts,
    the last layer's left out (pending, not counted)."""
    tiles, count = -(-n_rows // 32), 0
    for after in live[:-1]:
        new = -(-after // 32)
        if new < tiles and (tiles - new) * 10 >= tiles:
            tiles, count = new, count + 1
    return count


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("n_layers", [6, 5])
def test_compaction_written_by_the_next_layer(n_layers):
    """Survivors moved to dense tiles by the next layer as it writes them (grouped,
    ELL and CSR4 kernels) or by compact_rows (before the general CSR kernel), and
    left pending after the last layer: ids exact, features within 1e-5 of the
    reference, the same with batches and without CUDA graphs."""
    net, rows = _dying_mixed_network(np.random.default_rng(0))
    net = Network(net.layers[:n_layers])
    backend = _backend()
    res = _check(net, rows, backend)
    info = backend.describe()
    assert set(info["kernels"]) == ({"group", "csr_smem", "global", "csr4_smem", "smem32"}
                                    if n_layers == 6 else
                                    {"group", "csr_smem", "global", "csr4_smem"})
    n = int(np.count_nonzero(np.diff(rows.indptr)))
    live = res.live_per_layer.tolist()
    assert info["compactions_last_batch"] == _compactions_expected(live, n) >= 3
    for kw in ({"batch": 700}, {"graphs": False}):
        other = _backend(graphs=kw.get("graphs", True))
        other.load_network(net.layers)
        again = run_inference(net, rows, other, batch=kw.get("batch"), want_features=True)
        assert np.array_equal(again.alive_ids, res.alive_ids)
        assert np.array_equal(again.features, res.features)


def _dying_uniform_network(rng) -> tuple[Network, SparseRows]:
    """Uniform grouped layers (the shared-sum form, odd widths, groups of 9-16) with
    rows of six densities, so rows die layer after layer and the layers compact."""
    widths, degrees = [2000, 512, 700, 333, 512], [32, 16, 16, 32]
    layers = []
    for k, (n_in, n_out, d) in enumerate(zip(widths[:-1], widths[1:], degrees)):
        lo, hi = (-0.5, -0.1) if k == 0 else (-0.2, 0.0)
        layers.append(_block_layer(rng, n_in, n_out, d, values=False, min_group=9,
                                   bias=rng.uniform(lo, hi, n_out).astype(np.float32)))
    parts = [_random_rows(rng, 320, widths[0], dens, binary=False)
             for dens in (0.002, 0.005, 0.01, 0.02, 0.05, 0.3)]
    indptr = [np.zeros(1, dtype=np.int64)]
    for p in parts:
        indptr.append(p.indptr[1:] + indptr[-1][-1])
    return Network(layers), SparseRows(widths[0], np.concatenate(indptr),
                                       np.concatenate([p.indices for p in parts]))


@pytest.mark.gpu
@needs_gpu
def test_shared_sum_form_compacting_is_bit_identical_to_the_reference():
    """The shared-sum form of uniform grouped layers, in place and compacting (its
    slot-order stores), gives the reference's ids and features bit for bit (one sum
    a group in CSR order, then each slot's scale, bias and activation)."""
    net, rows = _dying_uniform_network(np.random.default_rng(5))
    backend = _backend()
    res = _check(net, rows, backend)
    info = backend.describe()
    assert info["kernels"] == {"group": len(net.layers)}
    assert info["kernel_names"] == {"layer_group_sum<32>": 2, "layer_group_sum<16>": 2}
    n = int(np.count_nonzero(np.diff(rows.indptr)))
    assert info["compactions_last_batch"] == _compactions_expected(
        res.live_per_layer.tolist(), n) >= 3  # live 1217, 809, 494, 320 of 1912
    _, ref = reference_infer(net, rows)
    assert np.array_equal(res.features, ref)


def _challenge_dir() -> Path:
    env = os.environ.get("SPDNN_CHALLENGE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "graphchallenge"


def _read_real_layers(n_layers: int) -> list[Layer]:
    """Layers 1..n of the official 1024 network (gz TSV files)."""
    folder = _challenge_dir() / "neuron1024"
    if not folder.is_dir():
        pytest.skip(f"official 1024 network not found in {folder} (set SPDNN_CHALLENGE_DIR)")
    from spdnn_mpi.formats.tsv.tree import iter_layers

    return list(iter_layers(folder, 1024, n_layers, bias=-0.30, clip=32.0))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", ["auto", "global", "csr"])
def test_real_1024_network_categories(variant):
    rng = np.random.default_rng(5)
    net = Network(_read_real_layers(30))
    # ~10% dense binary rows, plus denser ones so that some rows survive
    rows = _random_rows(rng, 3000, 1024, 0.1)
    dense = _random_rows(rng, 1000, 1024, 0.4)
    both = SparseRows(1024, np.concatenate([rows.indptr, dense.indptr[1:] + rows.indptr[-1]]),
                      np.concatenate([rows.indices, dense.indices]))
    res = _check(net, both, _backend(variant=variant), features=False)
    assert res.live_per_layer[0] > 0 and len(res.alive_ids) < both.n_rows


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("variant", ["auto", "csr"])
def test_radixnet_4096_categories_and_batching(variant):
    from spdnn_mpi.generators.radixnet import radixnet_network

    rng = np.random.default_rng(6)
    net = radixnet_network(4096, 16)
    a = _random_rows(rng, 1500, 4096, 0.1)
    b = _random_rows(rng, 500, 4096, 0.45)
    rows = SparseRows(4096, np.concatenate([a.indptr, b.indptr[1:] + a.indptr[-1]]),
                      np.concatenate([a.indices, b.indices]))
    backend = _backend(variant=variant)
    whole = _check(net, rows, backend, features=True)
    batched = run_inference(net, rows, backend, batch=300, want_features=True)
    assert batched.batches == 7
    assert np.array_equal(batched.alive_ids, whole.alive_ids)
    assert np.array_equal(batched.features, whole.features)
    assert np.array_equal(batched.live_per_layer, whole.live_per_layer)
    direct = _backend(variant=variant, graphs=False)  # launches without CUDA graphs
    direct.load_network(net.layers)
    again = run_inference(net, rows, direct, batch=700, want_features=True)
    assert np.array_equal(again.alive_ids, whole.alive_ids)
    assert np.array_equal(again.features, whole.features)
    assert backend.describe()["graphs"] == "on"


@pytest.mark.gpu
@needs_gpu
def test_edge_cases_every_row_dies_none_die_one_row_zero_rows():
    rng = np.random.default_rng(7)
    kill = _random_network(rng, [64, 64, 64], values=False, bias="scalar")
    for layer in kill.layers:
        layer.bias = -100.0
    rows = _random_rows(rng, 100, 64, 0.2)
    res = _check(kill, rows)
    assert len(res.alive_ids) == 0 and res.live_per_layer.tolist() == [0, 0]

    keep = _random_network(rng, [64, 80, 64], bias="scalar")
    for layer in keep.layers:
        layer.bias = np.full(layer.n_out, 0.5, dtype=np.float32)  # positive: nothing dies
    res = _check(keep, rows)
    assert len(res.alive_ids) == rows.n_rows

    net = _random_network(rng, [64, 64, 64], values=True, bias="vector")
    _check(net, _random_rows(rng, 1, 64, 0.5))
    empty = SparseRows(64, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint16))
    res = _check(net, empty)
    assert len(res.alive_ids) == 0
    # rows with no input at all are dropped up front; ids stay those of the input
    gaps = _random_rows(rng, 40, 64, 0.3)
    dense = gaps.to_dense()
    dense[::3] = 0
    _check(net, SparseRows.from_dense(dense, first_row=1000))


@pytest.mark.gpu
@needs_gpu
def test_describe_reports_memory_and_timing():
    rng = np.random.default_rng(8)
    net = _random_network(rng, [100, 100, 100])
    backend = _backend(device=0)
    backend.load_network(net.layers)
    res = run_inference(net, _random_rows(rng, 64, 100, 0.3), backend)
    info = backend.describe()
    assert info["peak_device_bytes"] > 0 and info["sms"] > 0
    assert res.layer_seconds is not None and len(res.layer_seconds) == 2
    assert backend.max_batch_rows(1024) >= 32


@pytest.mark.gpu
@needs_gpu
def test_released_buffers_are_allocated_again_and_graphs_still_serve():
    """release_buffers (before a peer) frees the device arrays of the batch; the
    next run allocates them again and its results are the same bit for bit."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(9)
    net = _random_network(rng, [300, 300, 300, 300])
    rows = _random_rows(rng, 2000, 300, 0.2)
    backend = _backend(device=0)
    backend.load_network(net.layers)
    first = run_inference(net, rows, backend, want_features=True)
    held = cp.get_default_memory_pool().used_bytes()
    backend.release_buffers()
    assert cp.get_default_memory_pool().used_bytes() < held
    again = run_inference(net, rows, backend, want_features=True)
    np.testing.assert_array_equal(first.alive_ids, again.alive_ids)
    np.testing.assert_array_equal(first.features.view(np.uint32), again.features.view(np.uint32))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("peer", ["cusparse", "torch"])
def test_gpu_peers_agree_with_reference(peer):
    from spdnn_mpi.bench.peers import gpu_sparse as peers_gpu
    from spdnn_mpi.errors import SpdnnError

    rng = np.random.default_rng(9)
    net = _random_network(rng, [80, 80, 80, 80], bias="vector")
    rows = _random_rows(rng, 120, 80, 0.2)
    fn = peers_gpu.cusparse_infer if peer == "cusparse" else peers_gpu.torch_sparse_infer
    try:
        ids, seconds = fn(net, rows)
    except SpdnnError as exc:
        pytest.skip(str(exc))
    ref_ids, _ = reference_infer(net, rows)
    assert np.array_equal(ids, ref_ids) and seconds > 0


@pytest.mark.gpu
@needs_gpu
def test_layout_build_reports_progress_per_layer():
    """The CUDA layout build (seconds at N = 65536 x 1920) tells a Progress how far it is."""
    from spdnn_mpi.util.progress import Progress

    rng = np.random.default_rng(12)
    network = _random_network(rng, [96] * 7)
    lines, done = [], []
    bar = Progress("layout", network.n_layers, lines.append, every=0.0)
    backend = _backend()
    backend.load_network(network.layers, progress=lambda k: (done.append(k), bar(k)))
    assert done == list(range(1, network.n_layers + 1))
    assert lines[-1].startswith(f"layout: layer {network.n_layers}/{network.n_layers}")
    rows = _random_rows(rng, 50, 96, 0.2)
    res = run_inference(network, rows, backend)
    np.testing.assert_array_equal(res.alive_ids, reference_infer(network, rows)[0])


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
            memcpyAsync=memcpy_async, memcpyDeviceToHost="d2h"))

        @staticmethod
        def empty(words, dtype):
            return _FakeDeviceArray(np.zeros(words, dtype=dtype), copies)

    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=np.zeros))
    packed = rb.PackedResults(FakeCp(), contextlib.nullcontext())
    head, per_row, alive = rb.results_head(3), 1 + width, rows // 2
    upper = head + rows * per_row
    plan = packed.prepare(3, width, True, rows)
    out = packed.device
    assert plan == (head, per_row, upper, upper if packed.fits_one_copy(upper) else 0)
    key = packed.copy_key(upper)
    assert packed.ensure(upper - 5) is out and packed.allocations == 2  # reused
    assert packed.copy_key(upper) == key and key[0] == out.data.ptr and key[2] == upper
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


class _FakeStream:
    def __init__(self, fail=False):
        self.fail, self.captured = fail, []

    def begin_capture(self):
        if self.fail:
            raise RuntimeError("capture not supported")

    def end_capture(self):
        return ("graph", len(self.captured))


def test_graph_cache_keys_pieces_by_what_they_launch_and_turns_off_on_failure():
    from spdnn_mpi.backends.cuda.graphs import GraphCache

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
    import contextlib

    from spdnn_mpi.backends.cuda.layer_queue import LayerQueue

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
    queue = LayerQueue(types.SimpleNamespace(), results, contextlib.nullcontext(), Stream(),
                       132, graphs=True)
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
    log.clear()  # merging: the piece is captured for every number of rows held
    queue.merging, queue.pending = True, [(2, True)]
    queue.flush()
    assert log == ["begin", "layer2", "end"] * 4 + ["graph"]
    queue.graphs.on = False
    log.clear()
    queue.pending = [(0, True)]
    queue.flush(gather=gather)
    assert log == ["layer0", "gather", "copy77"]


def test_blocks_per_sm_is_bound_by_registers_threads_or_shared_memory():
    """The occupancy the grids are sized by (H100 properties; no GPU needed)."""
    from spdnn_mpi.backends.cuda.launch import blocks_per_sm

    props = {"regsPerMultiprocessor": 65536, "maxThreadsPerMultiProcessor": 2048,
             "sharedMemPerMultiprocessor": 233472}

    def kern(regs, static=0):
        return types.SimpleNamespace(num_regs=regs, shared_size_bytes=static)

    assert blocks_per_sm(props, kern(119, 144), 512, 100 * 1024) == 1  # registers
    assert blocks_per_sm(props, kern(32), 256, 0) == 8  # threads
    assert blocks_per_sm(props, kern(32), 128, 60 * 1024) == 3  # shared memory
    assert blocks_per_sm(props, kern(255), 1024, 0) == 1  # never below one
