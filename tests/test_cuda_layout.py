"""Host side of the CUDA backend (no GPU): kernel sources, layer plans, device layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import block_layer, fixed_degree_layer

from spdnn_mpi.backends.cuda import layout as lay
from spdnn_mpi.model import Layer, stacked_indices


def test_the_device_grouping_kernels_share_the_hosts_constants():
    from spdnn_mpi.backends.cuda import grouping

    src = (Path(__file__).resolve().parents[1] / "cuda" / "spdnn_group_layout.cu").read_text()
    assert f"#define GL_SLOTS {lay.GROUP_SLOTS} " in src
    assert f"#define GL_HASH_MUL 0x{int(lay._HASH_MUL):X}ull " in src
    assert f"#define GL_WALK_THREADS {grouping.WALK_THREADS} " in src
    assert all(f"void {name}(" in src or f"    {name}(" in src
               for name in grouping.GROUP_LAYOUT_KERNELS)


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
                   "scatter_rows", "scatter_bits", "stamp"):
        assert f" {kernel}(" in src or f"\n    {kernel}(" in src, kernel
    assert "#pragma once" not in src and src.count("struct LayerArgs {") == 1


def test_installed_package_maps_to_cuda_folder():
    """setup.cfg ships cuda/*.cu and *.cuh as package spdnn_mpi.kernels."""
    text = (Path(__file__).resolve().parents[1] / "setup.cfg").read_text()
    assert "spdnn_mpi.kernels = cuda" in text
    assert "*.cu" in text and "*.cuh" in text


@pytest.mark.parametrize("n_in,n_out,kind", [(300, 64, "smem32"), (300, 33, "global"),
                                             (9000, 70, "global")])
def test_ell_layout_covers_every_output_once(n_in, n_out, kind):
    rng = np.random.default_rng(n_out)
    layer = fixed_degree_layer(rng, n_in, n_out, 16)
    plan = lay.plan_layer(layer, 200 * 1024, "smem32" if kind == "smem32" else "global")
    assert plan.kind == kind and plan.is_ell
    flat, out_ids = lay.ell_layout(layer)
    assert flat.dtype == np.uint16 and out_ids.dtype == np.int32
    assert np.array_equal(np.sort(out_ids), np.arange(n_out))  # a permutation
    back = np.empty((n_out, 16), dtype=np.uint16)
    back[out_ids] = flat.reshape(n_out, 16)
    assert np.array_equal(back.ravel(), layer.indices)  # CSR order kept within each output


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("n_in,n_out,degree,max_group", [(300, 203, 32, 16), (5000, 77, 8, 40),
                                                          (64, 1000, 64, 3)])
def test_group_layout_covers_every_output_once(n_in, n_out, degree, max_group, values):
    rng = np.random.default_rng(n_out + degree)
    layer = block_layer(rng, n_in, n_out, degree, values=values, max_group=max_group)
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


def test_group_layout_of_radixnet_layers_is_full():
    """RadiX-Net layers (the challenge's) are groups of 16 outputs sharing 32 inputs."""
    from spdnn_mpi.generators.radixnet import radixnet_network

    for layer in radixnet_network(1024, 3).layers:
        gl = lay.group_layout(layer)
        assert gl.fill == 1.0 and gl.n_groups == 1024 // 16


def test_plan_takes_group_only_for_fixed_degree_16_bit_layers():
    rng = np.random.default_rng(4)
    uniform = fixed_degree_layer(rng, 300, 64, 16)
    assert lay.plan_layer(uniform, 200 * 1024).kind == "group"
    assert lay.plan_layer(uniform, 200 * 1024, grouped=False).kind == "smem32"
    assert lay.plan_layer(uniform, 200 * 1024, "csr").kind == "csr_smem"
    odd = fixed_degree_layer(rng, 300, 64, 12)
    assert lay.plan_layer(odd, 200 * 1024, "group").kind == "csr4_smem"


def test_module_instantiates_only_what_the_plans_can_launch(monkeypatch):
    from spdnn_mpi.backends.cuda import held as held_layers
    from spdnn_mpi.backends.cuda.compile import fallback_names, kernel_names

    rng = np.random.default_rng(4)
    uniform = fixed_degree_layer(rng, 300, 64, 32)
    weighted = block_layer(rng, 300, 64, 16)
    smem = 200 * 1024
    scatter = {"scatter_rows<u16>", "scatter_rows<int>"}
    ell = {lay.ell_kernel("smem32", 32, rows) for rows in (0, *lay.ELL_ROWS)}

    def names(layers, variant="auto", held=False):
        return set(kernel_names([lay.plan_layer(layer, smem, variant) for layer in layers],
                                layers if held else None))

    # grouped: the shared-sum form only (what auto falls back to is known once laid out);
    # a first layer in it reads binary inputs as bits, put there by scatter_bits
    bits = {"scatter_bits<u16>", "scatter_bits<int>"}
    assert names([uniform, uniform]) == scatter | bits | {"layer_group_sum<32>"}
    assert names([uniform], "group") == scatter | bits | {"layer_group_sum<32>"}
    assert names([weighted]) == scatter | {"layer_group<16>"}
    assert names([uniform], "csr") == scatter | {"layer_csr<true,false,u16>"}
    assert names([weighted, uniform]) == names([uniform]) - bits | names([weighted])
    # where converged layers run in one launch: the shared-sum layers' one-launch form
    # (any rows held), one block a row up to held.ROW_MAX_WIDTH, over the card beyond
    # (with a barrier a layer, or as a flow)
    held = {"layers_held_row<32>"}
    assert names([uniform, weighted], held=True) == names([uniform, weighted]) | held
    assert names([weighted], held=True) == names([weighted])
    monkeypatch.setattr(held_layers, "ROW_MAX_WIDTH", 299)  # uniform: 300 inputs
    assert names([uniform], held=True) == names([uniform]) | {"layers_held_grid<32>",
                                                              "layers_held_flow<32>"}
    monkeypatch.undo()
    # sparse groups: the ELL forms (uniform) or CSR4 (weighted), beyond what was compiled
    fallen = [lay.plan_layer(layer, smem, grouped=False) for layer in (uniform, weighted)]
    compiled = sorted(names([uniform, weighted]))
    assert set(fallback_names(fallen, compiled)) == ell | {"layer_csr4<true,true>"}
    assert fallback_names(fallen, compiled + sorted(ell)) == ["layer_csr4<true,true>"]


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
    from spdnn_mpi.backends.cuda.backend import CudaBackend
    from spdnn_mpi.errors import SpdnnError

    layer = fixed_degree_layer(np.random.default_rng(4), 100, 20, 8)
    with pytest.raises(SpdnnError, match="unknown CUDA kernel variant 'smem8'"):
        lay.plan_layer(layer, 200 * 1024, "smem8")
    with pytest.raises(SpdnnError, match="one of auto, group, smem32, global, csr"):
        CudaBackend(variant="l1")  # refused before CuPy is needed, so also without a GPU


def test_plan_falls_back_to_csr_for_general_layers():
    rng = np.random.default_rng(2)
    i, j = np.nonzero(rng.random((40, 30)) < 0.3)
    layer = Layer.from_coo(i, j, rng.normal(size=len(i)), 40, 30)
    plan = lay.plan_layer(layer, 200 * 1024)
    assert plan.kind.startswith("csr")


@pytest.mark.parametrize("values", [True, False])
def test_layers_grouped_together_equal_each_grouped_alone(values):
    """``group_layouts`` of many layers at once (one upload, a few operations) gives each
    layer exactly the arrays it gets alone."""
    rng = np.random.default_rng(12)
    layers = [block_layer(rng, 300, 203, 16, values=values, max_group=k) for k in (1, 5, 16, 40)]
    layers.append(fixed_degree_layer(rng, 300, 203, 16) if not values else layers[0])
    together = lay.group_layouts(layers)
    for layer, got in zip(layers, together):
        alone = lay.group_layout(layer)
        assert got.n_groups == alone.n_groups and got.wstride == alone.wstride
        assert got.fill == alone.fill
        for name in ("indices", "out_ids", "weights"):
            np.testing.assert_array_equal(getattr(got, name), getattr(alone, name))


def test_layers_of_a_packed_store_are_stacked_without_a_copy(tmp_path):
    from spdnn_mpi.formats.store.reader import Store, StoreWriter
    from spdnn_mpi.model import SparseRows

    rng = np.random.default_rng(13)
    layers = [fixed_degree_layer(rng, 64, 64, 8) for _ in range(5)]
    with StoreWriter(tmp_path / "s.h5") as w:
        for layer in layers:
            w.add_layer(layer)
        w.write_inputs(SparseRows.from_dense(np.eye(3, 64, dtype=np.float32)))
    with Store(tmp_path / "s.h5") as st:
        read = st.network().layers
    stacked = stacked_indices(read)
    assert np.shares_memory(stacked, read[0].indices)  # one buffer, no copy
    np.testing.assert_array_equal(stacked, stacked_indices(layers))  # copied: the same
    assert stacked.shape == (5, 64, 8)


def test_kernels_come_from_the_program_compiled_with_them():
    from spdnn_mpi.backends.cuda.compile import KernelModules

    class Module:
        def __init__(self, tag):
            self.tag = tag

        def get_function(self, name):
            return (self.tag, name)

    modules = KernelModules(Module("first"), ["layer_group_sum<32>"])
    modules.add(Module("second"), ["layer_ell_smem<32,32,false>"])
    assert modules.get_function("layer_group_sum<32>") == ("first", "layer_group_sum<32>")
    assert modules.get_function("layer_ell_smem<32,32,false>")[0] == "second"
    assert modules.get_function("compact_rows")[0] == "first"  # in every program
    with pytest.raises(KeyError, match="layer_csr4<true,true> was not among"):
        modules.get_function("layer_csr4<true,true>")
