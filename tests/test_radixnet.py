"""The RadiX-Net generator: structure, seeding, and agreement with the real network."""

from __future__ import annotations

import numpy as np
import pytest

from spdnn_mpi.generators.radixnet import (
    base_layer_count,
    iter_radixnet,
    layer_relabelling,
    radixnet_layer,
    radixnet_network,
)
from spdnn_mpi.model import CHALLENGE_CLIP, CHALLENGE_WEIGHT, Layer, challenge_bias, index_dtype


def described_base_layer(neurons: int, k: int) -> Layer:
    """Base layer k built literally from the description, one (i, j) at a time."""
    m = neurons // 16
    ii, jj = [], []
    for i in range(neurons):
        for r in {i % m, (i - 2 ** (k - 1)) % m}:
            for b in range(16):
                ii.append(i)
                jj.append(b * m + r)
    return Layer.from_coo(np.array(ii), np.array(jj), np.ones(len(ii)), neurons, neurons)


def dense_w(layer: Layer) -> np.ndarray:
    """W (inputs x outputs) as a 0/1 array."""
    return (layer.to_scipy_t().toarray().T != 0).astype(np.int8)


def base_residues(layer: Layer, base: int) -> np.ndarray:
    """For each input row i, the residue (mod M/2) of the base row it is a copy of.

    Row t of base layer ``base`` feeds outputs whose residues mod M are
    {t, t - d} with d = 2**(base-1); given the two residues of a row, t is
    the one whose ``- d`` is the other. Taken mod M/2 so that the top base
    layer, where d = M/2 makes t and t + M/2 indistinguishable, compares too.
    """
    n = layer.n_in
    m = n // 16
    d = 2 ** (base - 1)
    w = layer.to_scipy_t().T.tocsr()
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        a, b = np.unique(w.indices[w.indptr[i] : w.indptr[i + 1]] % m)
        out[i] = a if (a - d) % m == b else b
    return out % (m // 2)


@pytest.mark.parametrize("bad", [0, 16, 100, 128, 512, 2048, 1023, -1024, 16 * 4**11])
def test_rejects_neurons_not_16_times_a_power_of_4(bad):
    with pytest.raises(ValueError, match="16 \\* 4\\*\\*m"):
        base_layer_count(bad)


@pytest.mark.parametrize("bad", [1024.0, True, "1024", None])
def test_rejects_neurons_that_are_not_integers(bad):
    with pytest.raises(ValueError, match="integer"):
        base_layer_count(bad)


def test_base_layer_counts():
    assert [base_layer_count(16 * 4**m) for m in range(1, 8)] == [2, 4, 6, 8, 10, 12, 14]


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="seed"):
        radixnet_layer(1024, 1, seed=-1)
    with pytest.raises(ValueError, match="shuffle"):
        radixnet_layer(1024, 7, shuffle="never")
    with pytest.raises(ValueError, match="from 1"):
        radixnet_layer(1024, 0)
    with pytest.raises(ValueError, match="n_layers"):
        iter_radixnet(1024, 0)  # checked before the first layer is asked for
    with pytest.raises(ValueError, match="seed"):
        iter_radixnet(1024, 5, seed=-3)


@pytest.mark.parametrize("neurons", [64, 256, 1024])
def test_base_layers_follow_the_description(neurons):
    for k in range(1, base_layer_count(neurons) + 1):
        got = radixnet_layer(neurons, k, seed=5)
        want = described_base_layer(neurons, k)
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)


@pytest.mark.parametrize("neurons", [256, 1024, 4096, 65536])
def test_every_layer_has_the_challenge_shape(neurons):
    n_base = base_layer_count(neurons)
    for k in (1, n_base, n_base + 1, 3 * n_base + 2):
        layer = radixnet_layer(neurons, k, seed=3)
        assert (layer.n_in, layer.n_out, layer.nnz) == (neurons, neurons, 32 * neurons)
        assert layer.row_degree == 32
        assert np.all(np.bincount(layer.indices, minlength=neurons) == 32)
        rows = layer.indices.reshape(neurons, 32).astype(np.int64)
        assert np.all(np.diff(rows, axis=1) > 0), "indices sorted and distinct within a row"
        assert layer.indices.dtype == index_dtype(neurons)
        assert layer.values is None and layer.uniform_value == CHALLENGE_WEIGHT == 1 / 16
        assert layer.bias == challenge_bias(neurons) and layer.clip == CHALLENGE_CLIP


def test_indices_widen_beyond_65536():
    layer = radixnet_layer(262144, 15, seed=1)
    assert layer.indices.dtype == np.int32 and int(layer.indices.max()) == 262143


@pytest.mark.parametrize("shuffle", ["cycle", "layer"])
def test_later_layers_relabel_the_rows_of_their_base_layer(shuffle):
    neurons, n_base = 256, 4
    for k in (5, 8, 11):
        q = layer_relabelling(neurons, k, seed=9, shuffle=shuffle)
        assert sorted(q) == list(range(neurons))
        base = dense_w(radixnet_layer(neurons, (k - 1) % n_base + 1))
        shuffled = dense_w(radixnet_layer(neurons, k, seed=9, shuffle=shuffle))
        np.testing.assert_array_equal(shuffled[q], base)  # row q[t] of layer k is base row t


def test_first_cycle_is_unshuffled():
    assert all(layer_relabelling(1024, k, seed=4) is None for k in range(1, 7))
    assert layer_relabelling(1024, 7, seed=4) is not None


def test_relabelling_per_cycle_and_per_layer():
    same = [layer_relabelling(1024, k, seed=2) for k in range(7, 13)]
    assert all(np.array_equal(same[0], q) for q in same[1:])
    assert not np.array_equal(same[0], layer_relabelling(1024, 13, seed=2))
    per_layer = [layer_relabelling(1024, k, seed=2, shuffle="layer") for k in range(7, 13)]
    assert len({q.tobytes() for q in per_layer}) == 6


def test_seeded_and_deterministic():
    a = radixnet_layer(4096, 30, seed=11)
    b = radixnet_layer(4096, 30, seed=11)
    c = radixnet_layer(4096, 30, seed=12)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert not np.array_equal(a.indices, c.indices)
    # Any layer can be built on its own: the stream's 30th layer is the same.
    streamed = list(iter_radixnet(4096, 30, seed=11))[-1]
    np.testing.assert_array_equal(streamed.indices, a.indices)
    tail = list(iter_radixnet(4096, 2, seed=11, first=29))
    np.testing.assert_array_equal(tail[-1].indices, a.indices)


def test_network_and_provenance():
    net = radixnet_network(1024, 8, seed=7)
    assert net.n_layers == 8 and net.edges() == 8 * 32 * 1024
    assert net.provenance["seed"] == 7 and net.provenance["shuffle"] == "cycle"


# -- the real network ----------------------------------------------------------
def _real_layer(real_dir, k: int) -> Layer:
    from spdnn_mpi.formats.tsv.read import read_layer

    return read_layer(real_dir / f"n1024-l{k}.tsv.gz", 1024, 1024)


def test_real_first_cycle_is_exactly_the_base_layers(real_dir):
    for k in range(1, 7):
        real = _real_layer(real_dir, k)
        ours = radixnet_layer(1024, k)
        np.testing.assert_array_equal(real.indptr, ours.indptr)
        np.testing.assert_array_equal(real.indices, ours.indices)
        assert real.uniform_value == ours.uniform_value


def test_real_later_layers_relabel_rows_once_per_cycle(real_dir):
    """Real layer l is base layer ((l-1) mod 6)+1 with its rows relabelled, and
    the relabelling (seen through residues, all a layer reveals) is shared by
    the six layers of a cycle and differs between cycles. Our default
    generator has the same property."""
    by_cycle: dict[int, list[np.ndarray]] = {}
    for k in [*range(7, 19), 115, 116, 120]:
        base = (k - 1) % 6 + 1
        real = _real_layer(real_dir, k)
        # Same multiset of rows as the base layer: a row relabelling of it.
        w, wb = dense_w(real), dense_w(radixnet_layer(1024, base))
        assert sorted(map(bytes, w)) == sorted(map(bytes, wb))
        by_cycle.setdefault((k - 1) // 6, []).append(base_residues(real, base))
    for residues in by_cycle.values():
        assert all(np.array_equal(residues[0], r) for r in residues[1:])
    firsts = [r[0] for r in by_cycle.values()]
    assert len({r.tobytes() for r in firsts}) == len(firsts)
    # Ours: the same per-cycle sharing.
    ours = [base_residues(radixnet_layer(1024, k, seed=1), (k - 1) % 6 + 1) for k in range(7, 14)]
    assert all(np.array_equal(ours[0], r) for r in ours[1:6])
    assert not np.array_equal(ours[0], ours[6])
