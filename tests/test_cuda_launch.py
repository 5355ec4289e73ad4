"""One layer's launch on the CUDA backend (no GPU): kernels, grids, layout arguments,
occupancy, with NumPy layouts and kernels given by name."""

from __future__ import annotations

import types

import numpy as np
import pytest
from conftest import random_network

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.backends.cuda.config import KernelConfig
from spdnn_mpi.backends.cuda.launch import Launcher, blocks_per_sm
from spdnn_mpi.model import Layer


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


class _HostLauncher(Launcher):
    def group_layouts(self, layers):  # NumPy layouts: the host reference's groups
        return lay.group_layouts(layers)


def planning_launcher():
    """The launch planning of the CUDA backend with NumPy layouts and kernels by name."""
    return _HostLauncher(np, _FakeModule(), KernelConfig(), 132, "auto",
                         lambda kern, threads, smem: 2)


def test_shared_memory_limit_of_a_kernel_is_only_raised():
    """Two staged layers of the same kernel: the second, smaller, must not lower
    the limit the first needs (CUDA_ERROR_INVALID_VALUE at its launch)."""
    rng = np.random.default_rng(5)
    limit = 227 * 1024
    launcher = planning_launcher()
    wide, narrow = (random_network(rng, [n_in, 40], 0.1).layers[0] for n_in in (644, 533))
    for layer in (wide, narrow):
        entry = launcher.layer_entry(layer, lay.plan_layer(layer, limit), limit)
        assert entry.plan.kind == "csr4_smem"
    assert entry.full.kern.max_dynamic_shared_size_bytes == 644 * 128


@pytest.mark.parametrize("n,grid", [(1024, 2), (4096, 8)])
def test_converged_uniform_grouped_layers_keep_the_shared_sum_kernel(n, grid):
    """Once one tile is held, the shared-sum kernel over it, with the group layout and
    one warp step at a time, on a grid that covers the groups once."""
    from spdnn_mpi.generators.radixnet import radixnet_network

    limit = 227 * 1024
    layer = radixnet_network(n, 1).layers[0]
    entry = planning_launcher().layer_entry(layer, lay.plan_layer(layer, limit), limit)
    assert entry.full.kern.name == "layer_group_sum<32>" and entry.plan.kind == "group"
    assert {launch.kern.name for launch in entry.small.values()} == {"layer_group_sum<32>"}
    assert entry.extra_held[:5] == entry.extra[:5] and entry.extra_held[-1] == 1
    # n / 16 groups, 4 a warp step, 8 warps a block
    assert {launch.grid for launch in entry.small.values()} == {grid}


@pytest.mark.parametrize("n,per_sm", [(4096, 2), (16384, 1), (65536, 1)])
def test_wide_shared_sum_layers_run_one_block_an_sm(n, per_sm):
    """The shared-sum kernel's whole-tile grid: as many blocks as fit (two here) up to
    4096 inputs, one an SM from ``ONE_BLOCK_MIN_INPUTS`` on."""
    from spdnn_mpi.backends.cuda.launch import ONE_BLOCK_MIN_INPUTS
    from spdnn_mpi.generators.radixnet import radixnet_network

    limit = 227 * 1024
    layer = radixnet_network(n, 1).layers[0]
    entry = planning_launcher().layer_entry(layer, lay.plan_layer(layer, limit), limit)
    assert entry.full.kern.name == "layer_group_sum<32>"
    assert entry.full.grid == 132 * per_sm and (per_sm == 1) == (n >= ONE_BLOCK_MIN_INPUTS)


def test_uniform_grouped_layers_take_the_shared_sum_form():
    """One weight for every edge: a group's slots share one sum (layer_group_sum);
    per-edge values keep every slot's own sum (layer_group)."""
    from spdnn_mpi.generators.radixnet import radixnet_network

    limit = 227 * 1024
    layer = radixnet_network(1024, 1).layers[0]
    values = np.random.default_rng(1).normal(size=layer.nnz).astype(np.float32)
    valued = Layer(layer.n_in, layer.n_out, layer.indptr, layer.indices, values, None, -0.3)
    for case, want in [(layer, "layer_group_sum<32>"), (valued, "layer_group<32>")]:
        entry = planning_launcher().layer_entry(case, lay.plan_layer(case, limit), limit)
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
    entry = planning_launcher().layer_entry(layer, lay.plan_layer(layer, limit), limit)
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
    entry = planning_launcher().layer_entry(layer, lay.plan_layer(layer, limit), limit)
    assert {launch.kern.name for launch in entry.small.values()} == {"layer_group<32>"}
    assert entry.extra_held[:5] == entry.extra[:5] and entry.extra_held[-1] == 1


def test_blocks_per_sm_is_bound_by_registers_threads_or_shared_memory():
    """The occupancy the grids are sized by (H100 properties; no GPU needed)."""
    props = {"regsPerMultiprocessor": 65536, "maxThreadsPerMultiProcessor": 2048,
             "sharedMemPerMultiprocessor": 233472}

    def kern(regs, static=0):
        return types.SimpleNamespace(num_regs=regs, shared_size_bytes=static)

    assert blocks_per_sm(props, kern(119, 144), 512, 100 * 1024) == 1  # registers
    assert blocks_per_sm(props, kern(32), 256, 0) == 8  # threads
    assert blocks_per_sm(props, kern(32), 128, 60 * 1024) == 3  # shared memory
    assert blocks_per_sm(props, kern(255), 1024, 0) == 1  # never below one
