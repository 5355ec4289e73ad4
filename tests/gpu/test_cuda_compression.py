"""Exact compression on the CUDA backend (GPU tests): ``auto`` bit for bit equal to ``off``.

Networks where rows collapse (duplicated inputs, saturating layers, the real
network) and where they never do, on every kernel kind, with batching, with
CUDA graphs on and off, and with every hash forced equal so that only the
exact comparison decides.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    challenge_dir,
    duplicated_rows,
    random_inputs,
    random_network,
    saturating,
)

from spdnn_mpi.check_policy import CheckCosts
from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Layer, Network
from spdnn_mpi.reference import reference_infer

from .gpu_helpers import cuda_backend


def _both(net, rows, batch=None, **kw):
    """(off, auto) on fresh CUDA backends, features included; checks are free, so every
    due checkpoint merges and the device merge is what is tested."""
    out = []
    for mode in ("off", "auto"):
        backend = cuda_backend(**kw)
        backend.check_costs = CheckCosts()
        backend.load_network(net.layers)
        out.append(run_inference(net, rows, backend, batch=batch, want_features=True,
                                 compress=mode))
    return out


def _assert_exact(net, rows, off, auto):
    np.testing.assert_array_equal(off.alive_ids, auto.alive_ids)
    np.testing.assert_array_equal(off.features.view(np.uint32), auto.features.view(np.uint32))
    ids, feats = reference_infer(net, rows)
    np.testing.assert_array_equal(auto.alive_ids, ids)
    np.testing.assert_allclose(auto.features, feats, rtol=1e-5, atol=1e-5)


def _uniform_saturating(rng, width, n_layers, degree=32):
    layers = []
    for _ in range(n_layers):
        idx = np.sort(np.stack([rng.choice(width, degree, replace=False) for _ in range(width)]),
                      axis=1)
        indptr = np.arange(0, width * degree + 1, degree, dtype=np.int64)
        layers.append(Layer(width, width, indptr, idx.ravel().astype(np.uint16), None, 1 / 16,
                            -0.3, 32.0))
    return Network(layers)


@pytest.mark.parametrize("variant", ["auto", "group", "global", "csr"])
@pytest.mark.parametrize("batch", [None, 333])
def test_duplicated_inputs(variant, batch):
    rng = np.random.default_rng(11)
    net = random_network(rng, [96] * 17, 0.2, bias="vector")  # looks need 8 layers after
    for layer in net.layers:
        layer.bias = np.minimum(layer.bias_vector(), 0)
    rows = duplicated_rows(rng, 300, 5, 96, binary=False)
    off, auto = _both(net, rows, batch, variant=variant)
    _assert_exact(net, rows, off, auto)
    assert any(e["representatives"] < e["rows"] for b in auto.compression for e in b)


@pytest.mark.parametrize("ahead", [None, 64])
@pytest.mark.parametrize("width", [96, 300])
def test_merge_groups_equal_the_reference_backends(width, ahead, monkeypatch):
    """The device's groups (heads from its hash table) are ``np.unique``'s: the same
    kept rows, members and owners, over several tiles and two neuron chunks, for a
    merge that finds duplicates and a later one on the representatives. ``ahead``:
    a copy ahead shorter than the result, whose rest is read after the wait."""
    from spdnn_mpi.backends.cuda import merge
    from spdnn_mpi.backends.reference import ReferenceBackend

    if ahead is not None:
        monkeypatch.setattr(merge, "AHEAD_WORDS", ahead)

    rng = np.random.default_rng(21)
    net = random_network(rng, [width] * 4, 0.2, bias="vector")
    for layer in net.layers:
        layer.bias = np.minimum(layer.bias_vector(), 0)
    rows = duplicated_rows(rng, 150, 6, width, binary=False)
    found = []
    for backend in (cuda_backend(), ReferenceBackend()):
        backend.load_network(net.layers)
        backend.load_features(rows, drop_empty=True)
        groups = []
        for k in range(3):
            backend.run_layer(k, drop_dead=True)
            if k != 1:
                groups.append(backend.merge_duplicate_rows())
        found.append(groups)
    for ours, ref in zip(*found):
        assert ours.rows_before == ref.rows_before
        for field in ("kept", "members", "owners"):
            np.testing.assert_array_equal(getattr(ours, field), getattr(ref, field))
    first = found[1][0]
    assert 32 < first.representatives < first.rows_before


@pytest.mark.parametrize("graphs", [True, False])
def test_saturating_layers_collapse(graphs):
    rng = np.random.default_rng(12)
    net = saturating(rng, 128, 70)
    rows = random_inputs(rng, 2000, 128, 0.3, binary=False)
    off, auto = _both(net, rows, graphs=graphs)
    _assert_exact(net, rows, off, auto)
    assert auto.compression[0][-1]["representatives"] <= 32
    assert auto.computed_edges(net) < off.computed_edges(net) / 3


@pytest.mark.parametrize("width", [512, 3000])  # staged tiles, and gathers through L2
def test_uniform_challenge_values_collapse_with_every_hash_equal(width):
    rng = np.random.default_rng(width)
    net = _uniform_saturating(rng, width, 40)
    rows = random_inputs(rng, 1500, width, 0.3)
    from spdnn_mpi.backends.cuda.config import KernelConfig

    off, auto = _both(net, rows, config=KernelConfig(merge_collide=1))
    # a merge trusting the (all equal) hashes would fold every row into one
    _assert_exact(net, rows, off, auto)
    assert auto.compression[0] and 0 < len(off.alive_ids) < rows.n_rows


def test_rows_that_never_collapse():
    rng = np.random.default_rng(13)
    layers = []
    for _ in range(100):  # permutations: rows never meet, never die
        perm = rng.permutation(64)
        layers.append(Layer.from_coo(perm, np.arange(64), np.ones(64), 64, 64, bias=0.0))
    net = Network(layers)
    rows = random_inputs(rng, 500, 64, 0.4, binary=False)
    off, auto = _both(net, rows)
    _assert_exact(net, rows, off, auto)
    assert all(e["representatives"] == e["rows"] for e in auto.compression[0])


def test_real_1024_network_with_digit_inputs():
    from spdnn_mpi.formats.tsv.tree import iter_layers
    from spdnn_mpi.generators.digits import digit_images

    folder = challenge_dir() / "neuron1024"
    if not folder.is_dir():
        pytest.skip(f"official 1024 network not found in {folder}")
    net = Network(list(iter_layers(folder, 1024, 120, bias=-0.3, clip=32.0)))
    rows = digit_images(1024, 6000)
    off, auto = _both(net, rows)
    _assert_exact(net, rows, off, auto)
    last = auto.compression[0][-1]
    assert last["representatives"] <= 32 and last["images"] >= len(auto.alive_ids) > 0


@pytest.mark.parametrize("width", [512, 3000])
@pytest.mark.parametrize("distinct,held", [(3, 8), (12, 16), (25, 32)])
def test_few_rows_held_run_on_narrow_kernels(width, distinct, held):
    """Averaging layers keep distinct rows apart: after the first merge 3, 12 or 25
    rows are held, and the layers run on the 8-, 16- or 32-row kernels."""
    rng = np.random.default_rng(distinct + width)
    layers = []
    for _ in range(40):
        idx = np.sort(np.stack([rng.choice(width, 32, replace=False) for _ in range(width)]),
                      axis=1)
        indptr = np.arange(0, width * 32 + 1, 32, dtype=np.int64)
        layers.append(Layer(width, width, indptr, idx.ravel().astype(np.uint16), None, 1 / 32,
                            0.0, None))
    net = Network(layers)
    rows = duplicated_rows(rng, distinct, 50, width, binary=False)
    off, auto = _both(net, rows)
    _assert_exact(net, rows, off, auto)
    assert auto.compression[0][0]["representatives"] == distinct
    backend = cuda_backend()
    backend.check_costs = CheckCosts()
    backend.load_network(net.layers)
    run_inference(net, rows, backend, compress="auto")
    assert backend._queue.held == held


def _noting_flows(flows, flowed: list):
    """``HeldLayers.flows`` that also notes in ``flowed`` each run it lets flow."""
    def noted(k0: int, n_layers: int, rows_held: int) -> bool:
        ok = flows(k0, n_layers, rows_held)
        if ok:
            flowed.append(n_layers)
        return ok
    return noted


@pytest.mark.parametrize("width,degree,distinct,bias", [
    (512, 32, 3, -0.1),  # the rows held all live to the end
    (1024, 32, 25, -0.25),  # they die inside the runs: 25, 19, 5, then 1 live row
    (1024, 32, 25, -0.2),  # 25, 24, then 23
    (3000, 16, 12, 0.0), (2000, 32, 9, "vector"), ("1024/512", 32, 20, -0.1)])
def test_converged_grouped_layers_in_one_launch_equal_layer_by_layer(width, degree, distinct,
                                                                     bias):
    """RadiX-Net-like layers (groups of 16 outputs sharing their inputs, one weight):
    once the merged rows fit one tile, runs of them are one launch in each form the
    width may pick (held.held_form): one block a row held, one block an SM (with a
    barrier a layer, or as a flow where each layer stores one value a group).
    Each equal bit for bit to the layer-by-layer kernels and to direct mode, with the
    same live counts a layer; the reference agrees."""
    from conftest import block_layer

    from spdnn_mpi.backends.cuda import held

    # "1024/512": widths alternate, so a run's layers have other group counts
    widths = [int(w) for w in str(width).split("/")]
    rng = np.random.default_rng(widths[-1] + distinct)
    layers = []
    for k in range(48):
        n_in, n_out = widths[k % len(widths)], widths[(k + 1) % len(widths)]
        layer = block_layer(rng, n_in, n_out, degree, values=False, min_group=16,
                            bias=0.0 if bias == "vector" else bias, clip=32.0)
        if bias == "vector":
            layer.bias = rng.uniform(-0.2, 0.05, n_out).astype(np.float32)
        layers.append(layer)
    width = widths[0]
    net = Network(layers)
    rows = duplicated_rows(rng, distinct, 60, width, binary=False)
    off, auto = _both(net, rows)
    _assert_exact(net, rows, off, auto)
    results = {}
    row_max_width = {"row": 1 << 30, "grid": 0, "flow": 0}
    for form in (*row_max_width, "layer by layer"):
        backend = cuda_backend()
        backend.check_costs = CheckCosts()
        flowed = []  # the runs launched as a flow: their lengths
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(held, "ROW_MAX_WIDTH", row_max_width.get(form, 0))
            patch.setattr(held, "FLOW_MIN_LAYERS", 2 if form == "flow" else 1 << 30)
            backend.load_network(net.layers)
            runs = backend._queue._held
            assert (runs is not None) == held.supported(backend._props)
            if form == "layer by layer":
                backend._queue._held = None
            elif runs is not None:  # the form asked for, and only it
                assert {name.split("<")[0] for name in runs._kernels} - {
                    held.KERNELS["flow"]} == {held.KERNELS[form if form == "row" else "grid"]}
                patch.setattr(runs, "flows", _noting_flows(runs.flows, flowed))
            results[form] = run_inference(net, rows, backend, want_features=True,
                                          compress="auto")
        assert backend._queue.held > 0  # the last layers ran on the rows held
        if form != "flow" or runs is None:
            assert not flowed
        elif bias != "vector":  # runs long enough to pass a barrier and reuse the ring
            assert max(flowed) > held.FLOW_RING, flowed
    plain = results.pop("layer by layer")
    for fused in results.values():
        np.testing.assert_array_equal(fused.alive_ids, plain.alive_ids)
        np.testing.assert_array_equal(fused.features.view(np.uint32),
                                      plain.features.view(np.uint32))
        np.testing.assert_array_equal(fused.live_per_layer, plain.live_per_layer)
        assert fused.compression == plain.compression
        np.testing.assert_array_equal(fused.features.view(np.uint32),
                                      auto.features.view(np.uint32))
