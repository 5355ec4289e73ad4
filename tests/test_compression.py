"""Exact activation compression: ``auto`` gives bit for bit the results of ``off``.

Networks are built here so that rows collapse (duplicated input rows,
saturating layers) or never do, with random values and biases; every fast
result is compared with the uncompressed run and with the plain reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import duplicated_rows, random_inputs, random_network, saturating
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spdnn_mpi.backends import make_backend
from spdnn_mpi.check_policy import CheckCosts
from spdnn_mpi.compression import MAX_GAP, Compressor, RowGroups, is_checkpoint
from spdnn_mpi.engine import run_inference
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Layer, Network, SparseRows
from spdnn_mpi.reference import reference_infer

BACKENDS = ["cpu", "reference"]


def run(net, rows, name, compress, **kw):
    """One run; checks cost nothing, so every due checkpoint merges and the merge
    itself is what is tested (when checks pay: test_check_policy.py)."""
    backend = make_backend(name)
    backend.check_costs = CheckCosts()
    backend.load_network(net.layers)
    return run_inference(net, rows, backend, want_features=True, compress=compress, **kw)


def assert_same(a, b):
    np.testing.assert_array_equal(a.alive_ids, b.alive_ids)
    assert a.features.dtype == b.features.dtype == np.float32
    np.testing.assert_array_equal(a.features.view(np.uint32), b.features.view(np.uint32))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("batch", [None, 37])
def test_duplicated_inputs_merge_and_match(name, batch):
    rng = np.random.default_rng(1)
    net = random_network(rng, [60, 60, 60, 60, 60, 60], 0.2, bias="vector")
    for layer in net.layers:  # biases <= 0, so dead rows drop; layer 3 kills some
        layer.bias = np.minimum(layer.bias_vector(), 0)
    net.layers[2].bias = net.layers[2].bias_vector() - 6.0
    rows = duplicated_rows(rng, 40, 6, 60, binary=False)
    off, auto = run(net, rows, name, "off", batch=batch), run(net, rows, name, "auto",
                                                             batch=batch)
    assert_same(off, auto)
    ids, feats = reference_infer(net, rows)
    np.testing.assert_array_equal(auto.alive_ids, ids)
    np.testing.assert_allclose(auto.features, feats, rtol=1e-5, atol=1e-6)
    assert 0 < len(ids) < rows.n_rows
    first = [b[0] for b in auto.compression if b]
    assert first and any(e["representatives"] < e["rows"] for e in first)
    assert auto.computed_edges(net) < off.computed_edges(net)


@pytest.mark.parametrize("name", BACKENDS)
def test_saturating_layers_collapse_to_few_rows(name):
    rng = np.random.default_rng(2)
    net = saturating(rng, 64, 40)
    rows = random_inputs(rng, 500, 64, 0.3, binary=False)
    off, auto = run(net, rows, name, "off"), run(net, rows, name, "auto")
    assert_same(off, auto)
    ids, _ = reference_infer(net, rows)
    np.testing.assert_array_equal(auto.alive_ids, ids)
    assert len(ids) > 100
    events = auto.compression[0]
    assert events[-1]["representatives"] <= 64  # fits one CPU tile: checks stop
    assert sum(e["images"] for e in events[-1:]) == events[-1]["images"] > 0
    assert auto.computed_rows_per_layer[-1] < off.computed_rows_per_layer[-1] / 5


@pytest.mark.parametrize("name", BACKENDS)
def test_rows_that_never_collapse_pay_few_checks(name):
    rng = np.random.default_rng(3)
    layers = []
    for _ in range(200):  # random permutations: rows move, never meet, never die
        perm = rng.permutation(50)
        layers.append(Layer.from_coo(perm, np.arange(50), np.ones(50), 50, 50, bias=0.0))
    net = Network(layers)
    rows = random_inputs(rng, 80, 50, 0.4, binary=False)
    off, auto = run(net, rows, name, "off"), run(net, rows, name, "auto")
    assert_same(off, auto)
    assert len(off.alive_ids) == len(np.unique(rows.to_dense(), axis=0)) == 80
    events = auto.compression[0]
    assert all(e["representatives"] == e["rows"] for e in events)
    # gaps double when a check finds nothing
    assert [e["layer"] for e in events] == [1, 4, 8, 16, 32, 64, 128]


def test_no_look_where_too_few_layers_follow(monkeypatch):
    """A backend whose looks are dear (CUDA: 8 layers) is not asked for the live
    count, nor to merge, at checkpoints with fewer layers after them."""
    rng = np.random.default_rng(4)
    rows = duplicated_rows(rng, 100, 2, 60, binary=False)  # more than a tile's rows
    for n_layers, looks in [(6, []), (12, [1, 2, 4])]:
        net = random_network(rng, [60] * (n_layers + 1), 0.2, bias="positive")
        backend = make_backend("cpu")
        backend.check_min_layers_left = 8
        backend.check_costs = CheckCosts()  # every look it is allowed
        backend.load_network(net.layers)
        asked = []

        def live_count(count=backend.live_count, asked=asked):
            asked.append(1)
            return count()

        monkeypatch.setattr(backend, "live_count", live_count)
        auto = run_inference(net, rows, backend, want_features=True, compress="auto")
        assert_same(run(net, rows, "cpu", "off"), auto)
        assert [e["layer"] for e in auto.compression[0]] == looks
        assert len(asked) == len(looks)


def test_checkpoints_do_not_depend_on_data():
    points = [k for k in range(1, 200) if is_checkpoint(k)]
    assert points[:4] == [1, 2, 4, 8] and 64 in points and 96 in points and 65 not in points


def test_compressor_resolves_chains_and_weights():
    c = Compressor(6, unit_rows=1)
    # rows 0..5: 1 -> 0 and 3 -> 2 at layer 1; then 2 -> 0 at layer 2; row 5 died (dropped)
    c.record(1, RowGroups(6, np.array([0, 2, 4, 5]), np.array([1, 3]), np.array([0, 2])))
    c.record(2, RowGroups(3, np.array([0, 4]), np.array([2]), np.array([0])))
    np.testing.assert_array_equal(c.roots(), [0, 0, 0, 0, 4, 5])
    assert [e.images for e in c.events] == [6, 5]
    feats = np.array([[1.0], [7.0]], dtype=np.float32)
    rows, f = c.expand(np.array([0, 4]), feats)
    np.testing.assert_array_equal(rows, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(f[:, 0], [1, 1, 1, 1, 7])
    rows, _ = c.expand(np.array([4]), None)
    np.testing.assert_array_equal(rows, [4])


def test_merges_are_folded_once_in_order_when_asked():
    """``record`` only decides the cadence; ``fold`` (run by the engine while the device
    works) maps the merges, each once, in the order they ran."""
    c = Compressor(6, unit_rows=2)
    c.record(1, RowGroups(6, np.array([0, 2, 4, 5]), np.array([1, 3]), np.array([0, 2])))
    assert not c.done and c.due(2) and c._owner is None  # nothing folded or allocated yet
    c.record(2, RowGroups(3, np.array([0, 4]), np.array([2]), np.array([0])))
    assert c.done and not c.due(3)  # two representatives fit the unit
    c.fold()
    c.fold()
    np.testing.assert_array_equal(c._weight[[0, 4]], [4, 1])
    assert [(e.layer, e.rows, e.representatives, e.images) for e in c.events] == [
        (1, 6, 4, 6), (2, 3, 2, 5)]
    np.testing.assert_array_equal(Compressor(3).roots(), [0, 1, 2])


def test_engine_folds_while_the_device_finishes(monkeypatch):
    """The engine hands the fold to ``finish``; the report still lists every check."""
    from spdnn_mpi.backends.cpu.backend import CpuBackend

    rng = np.random.default_rng(6)
    net = random_network(rng, [60] * 13, 0.2, bias="positive")
    rows = duplicated_rows(rng, 100, 2, 60, binary=False)
    backend = make_backend("cpu")
    backend.check_min_layers_left = 8
    backend.check_costs = CheckCosts()
    backend.load_network(net.layers)
    handed = []
    finish = CpuBackend.finish

    def spy(self, want_features, meanwhile=None):
        handed.append(meanwhile)
        return finish(self, want_features, meanwhile)

    monkeypatch.setattr(CpuBackend, "finish", spy)
    auto = run_inference(net, rows, backend, want_features=True, compress="auto")
    assert len(handed) == 1 and handed[0].__name__ == "fold"
    assert_same(run(net, rows, "cpu", "off"), auto)
    assert [e["layer"] for e in auto.compression[0]] == [1, 2, 4]


def test_hash_collisions_never_merge_different_rows(monkeypatch):
    """Every row hashes alike: only the exact comparison keeps the results right."""
    from spdnn_mpi.backends.cpu import kernels as cpu_kernels

    rng = np.random.default_rng(4)
    net = random_network(rng, [40] * 9, 0.3, bias="vector")
    rows = duplicated_rows(rng, 30, 4, 40, binary=False)
    off = run(net, rows, "cpu", "off")
    monkeypatch.setattr(cpu_kernels, "row_hashes",
                        lambda bits, n, width: np.zeros(n, dtype=np.uint64))
    auto = run(net, rows, "cpu", "auto")
    assert_same(off, auto)
    assert auto.compression[0][0]["representatives"] < auto.compression[0][0]["rows"]


def test_negative_zero_is_not_merged_with_zero():
    """Bit identity, not equality: -0.0 and 0.0 rows stay apart (they could part later)."""
    from spdnn_mpi.backends.cpu.backend import CpuBackend

    backend = CpuBackend()
    lay = Layer(2, 2, np.array([0, 1, 2]), np.array([0, 1], dtype=np.uint16),
                np.array([1.0, 1.0], np.float32), None, 0.0, None)
    backend.load_network([lay])
    rows = SparseRows.from_dense(np.array([[1, 1], [1, 1], [2, 1]], np.float32))
    backend.load_features(rows, drop_empty=False)
    backend._cur[0, 0, 1] = -0.0  # rows 0 and 1 now differ only by the sign of a zero
    backend._cur[0, 0, 0] = 0.0
    groups = backend.merge_duplicate_rows()
    assert groups.representatives == 3 and len(groups.members) == 0


def test_unknown_mode_is_refused():
    rng = np.random.default_rng(5)
    net = random_network(rng, [8, 8], 0.5)
    with pytest.raises(SpdnnError, match="compress"):
        run(net, random_inputs(rng, 4, 8), "cpu", "fast")


def test_gap_is_bounded():
    c = Compressor(10)
    for k in range(1, 40):
        c.record(k, RowGroups(10, np.arange(10), np.zeros(0, int), np.zeros(0, int)))
    assert c._gap == MAX_GAP


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    widths=st.lists(st.integers(1, 70), min_size=2, max_size=8),
    n_distinct=st.integers(1, 40),
    copies=st.integers(1, 5),
    bias=st.sampled_from(["scalar", "vector", "positive"]),
    clip=st.sampled_from([None, 32.0, 1.0]),
    batch=st.sampled_from([None, 1, 13]),
)
def test_random_cases_auto_equals_off(seed, widths, n_distinct, copies, bias, clip, batch):
    rng = np.random.default_rng(seed)
    net = random_network(rng, widths, 0.3, bias=bias, clip=clip)
    rows = duplicated_rows(rng, n_distinct, copies, widths[0], binary=bool(seed % 2))
    ids, _ = reference_infer(net, rows)
    for name in BACKENDS:
        off = run(net, rows, name, "off", batch=batch)
        auto = run(net, rows, name, "auto", batch=batch)
        assert_same(off, auto)
        np.testing.assert_array_equal(auto.alive_ids, ids)
