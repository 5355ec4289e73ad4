"""The CUDA kernels against the scipy reference (GPU): every kernel kind, random and
block-sparse networks, compaction in every form, edge cases."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from conftest import block_layer, fixed_degree_layer, random_inputs, random_network

from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Layer, Network, SparseRows
from spdnn_mpi.reference import reference_infer

from .gpu_helpers import check, cuda_backend


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
def test_random_networks_match_reference(widths, values, bias, clip, binary):
    rng = np.random.default_rng(zlib.crc32(repr((widths, values, bias, binary)).encode()))
    net = random_network(rng, widths, uniform=not values, bias=bias, clip=clip)
    rows = random_inputs(rng, 150, widths[0], 0.15, binary)
    check(net, rows)


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
        layers.append(fixed_degree_layer(rng, n_in, n_out, degree, bias=bias, value=value))
    net = Network(layers)
    rows = random_inputs(rng, 700, widths[0], 0.3, binary=False)
    check(net, rows, cuda_backend(variant=variant))


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
        layers.append(block_layer(rng, n_in, n_out, degree, values=values,
                                   max_group=max_group, bias=bias))
    net = Network(layers)
    rows = random_inputs(rng, 900, widths[0], 0.3, binary=False)
    backend = cuda_backend(variant="group")
    res = check(net, rows, backend)
    assert backend.describe()["kernels"] == {"group": len(layers)}
    if not values:
        _, ref = reference_infer(net, rows)
        assert np.array_equal(res.features, ref)
    # 16 slots a lane and warps taking 4 steps in a row: another split, the same sums
    from spdnn_mpi.backends.cuda import launch
    from spdnn_mpi.backends.cuda.config import KernelConfig

    monkeypatch.setattr(launch, "GROUP_CHUNK", 4)
    plain = cuda_backend(variant="group",
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
        block_layer(rng, 3000, 512, 32, bias=bias(512, -2.5, -1.0), min_group=16),  # group
        general(512, 3000, 0.02, np.int32, bias(3000)),  # csr_smem
        fixed_degree_layer(rng, 3000, 512, 16, bias=bias(512), value=0.2),  # ELL global
        block_layer(rng, 512, 700, 16, values=False, bias=bias(700), min_group=16),  # group
        general(700, 512, 0.05, np.uint16, bias(512)),  # csr4_smem
        fixed_degree_layer(rng, 512, 300, 32, bias=bias(300), value=0.12),  # ELL smem
    ])
    parts = [random_inputs(rng, 300, 3000, d) for d in (0.0015, 0.005, 0.01, 0.02, 0.04, 0.08)]
    parts.append(random_inputs(rng, 200, 3000, 0.3))
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


@pytest.mark.parametrize("n_layers", [6, 5])
def test_compaction_written_by_the_next_layer(n_layers):
    """Survivors moved to dense tiles by the next layer as it writes them (grouped,
    ELL and CSR4 kernels) or by compact_rows (before the general CSR kernel), and
    left pending after the last layer: ids exact, features within 1e-5 of the
    reference, the same with batches and without CUDA graphs."""
    net, rows = _dying_mixed_network(np.random.default_rng(0))
    net = Network(net.layers[:n_layers])
    backend = cuda_backend()
    res = check(net, rows, backend)
    info = backend.describe()
    assert set(info["kernels"]) == ({"group", "csr_smem", "global", "csr4_smem", "smem32"}
                                    if n_layers == 6 else
                                    {"group", "csr_smem", "global", "csr4_smem"})
    n = int(np.count_nonzero(np.diff(rows.indptr)))
    live = res.live_per_layer.tolist()
    assert info["compactions_last_batch"] == _compactions_expected(live, n) >= 3
    for kw in ({"batch": 700}, {"graphs": False}):
        other = cuda_backend(graphs=kw.get("graphs", True))
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
        layers.append(block_layer(rng, n_in, n_out, d, values=False, min_group=9,
                                   bias=rng.uniform(lo, hi, n_out).astype(np.float32)))
    parts = [random_inputs(rng, 320, widths[0], dens, binary=False)
             for dens in (0.002, 0.005, 0.01, 0.02, 0.05, 0.3)]
    indptr = [np.zeros(1, dtype=np.int64)]
    for p in parts:
        indptr.append(p.indptr[1:] + indptr[-1][-1])
    return Network(layers), SparseRows(widths[0], np.concatenate(indptr),
                                       np.concatenate([p.indices for p in parts]))


def test_shared_sum_form_compacting_is_bit_identical_to_the_reference():
    """The shared-sum form of uniform grouped layers, in place and compacting (its
    slot-order stores), gives the reference's ids and features bit for bit (one sum
    a group in CSR order, then each slot's scale, bias and activation)."""
    net, rows = _dying_uniform_network(np.random.default_rng(5))
    backend = cuda_backend()
    res = check(net, rows, backend)
    info = backend.describe()
    assert info["kernels"] == {"group": len(net.layers)}
    assert info["kernel_names"] == {"layer_group_sum<32>": 2, "layer_group_sum<16>": 2}
    n = int(np.count_nonzero(np.diff(rows.indptr)))
    assert info["compactions_last_batch"] == _compactions_expected(
        res.live_per_layer.tolist(), n) >= 3  # live 1217, 809, 494, 320 of 1912
    _, ref = reference_infer(net, rows)
    assert np.array_equal(res.features, ref)


def test_edge_cases_every_row_dies_none_die_one_row_zero_rows():
    rng = np.random.default_rng(7)
    kill = random_network(rng, [64, 64, 64], uniform=True, bias="scalar")
    for layer in kill.layers:
        layer.bias = -100.0
    rows = random_inputs(rng, 100, 64, 0.2)
    res = check(kill, rows)
    assert len(res.alive_ids) == 0 and res.live_per_layer.tolist() == [0, 0]

    keep = random_network(rng, [64, 80, 64], bias="scalar")
    for layer in keep.layers:
        layer.bias = np.full(layer.n_out, 0.5, dtype=np.float32)  # positive: nothing dies
    res = check(keep, rows)
    assert len(res.alive_ids) == rows.n_rows

    net = random_network(rng, [64, 64, 64], bias="vector")
    check(net, random_inputs(rng, 1, 64, 0.5))
    empty = SparseRows(64, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint16))
    res = check(net, empty)
    assert len(res.alive_ids) == 0
    # rows with no input at all are dropped up front; ids stay those of the input
    gaps = random_inputs(rng, 40, 64, 0.3)
    dense = gaps.to_dense()
    dense[::3] = 0
    check(net, SparseRows.from_dense(dense, first_row=1000))


@pytest.mark.parametrize("widths,degree,n_rows,bias", [([1024, 1024, 1024], 32, 3000, -0.45),
                                                       ([300, 1001, 203], 16, 77, -0.1),
                                                       ([4096, 4096], 32, 1000, -0.55)])
def test_binary_inputs_read_as_bits_equal_the_float_tiles(widths, degree, n_rows, bias,
                                                          monkeypatch):
    """A first layer on the shared-sum kernel reads binary inputs as bits
    (scatter_bits, ST_INPUT_BITS): the same features bit for bit as from float tiles,
    and as the reference, with odd widths and a partial last tile; inputs with values
    still go in as floats."""
    from spdnn_mpi.backends.cuda import backend as cuda_backend_module
    from spdnn_mpi.backends.cuda.readback import ST_INPUT_BITS

    rng = np.random.default_rng(zlib.crc32(repr((widths, n_rows)).encode()))
    net = Network([block_layer(rng, n_in, n_out, degree, values=False, min_group=16,
                               bias=bias, clip=32.0)
                   for n_in, n_out in zip(widths[:-1], widths[1:])])
    rows = random_inputs(rng, n_rows, widths[0], 0.3)
    assert rows.values is None
    backend = cuda_backend()
    bits = check(net, rows, backend)
    assert int(backend._buffers.state[ST_INPUT_BITS].get()) == 1
    assert len(bits.alive_ids) > 0
    _, ref = reference_infer(net, rows)
    assert np.array_equal(bits.features, ref)
    monkeypatch.setattr(cuda_backend_module, "reads_input_bits", lambda plans: False)
    floats = cuda_backend()
    floats.load_network(net.layers)
    plain = run_inference(net, rows, floats, want_features=True)
    assert int(floats._buffers.state[ST_INPUT_BITS].get()) == 0
    assert np.array_equal(plain.alive_ids, bits.alive_ids)
    assert np.array_equal(plain.features.view(np.uint32), bits.features.view(np.uint32))
    assert np.array_equal(plain.live_per_layer, bits.live_per_layer)
    monkeypatch.undo()
    valued = random_inputs(rng, n_rows, widths[0], 0.3, binary=False)
    backend = cuda_backend()
    check(net, valued, backend)
    assert int(backend._buffers.state[ST_INPUT_BITS].get()) == 0
