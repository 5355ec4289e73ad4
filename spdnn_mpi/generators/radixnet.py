"""RadiX-Net networks with the structure of the real Graph Challenge network.

With M = N / 16, base layer k (k = 1 .. log2 M) is a radix-2 butterfly on M neurons
Kronecker-expanded by a 16 x 16 block of ones: input i feeds every output j with
``j mod M`` in ``{i mod M, (i - 2**(k-1)) mod M}`` (32 nonzeros a row and a column,
each 1/16). Later layers repeat the base layers with their rows relabelled by a
seeded permutation: one a cycle, as in the real files (``shuffle="cycle"``), or
one a layer (``"layer"``). Output j's inputs depend only on ``j mod M``, so a
layer is M distinct rows tiled 16 times.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from spdnn_mpi.model import (
    CHALLENGE_CLIP,
    CHALLENGE_WEIGHT,
    Layer,
    Network,
    challenge_bias,
    index_dtype,
)

#: Side of the Kronecker block of ones (16 copies of each base row and column).
KRON = 16
#: Nonzeros per row and per column of every layer.
DEGREE = 2 * KRON
#: Largest N accepted (16 * 4**10): beyond it one layer alone is gigabytes.
MAX_NEURONS = 16 * 4**10
SHUFFLE_MODES = ("cycle", "layer")


def base_layer_count(neurons: int) -> int:
    """Number of radix-2 base layers, log2(N / 16); rejects N not of the form 16 * 4**m
    (a square, for sqrt(N) x sqrt(N) images), 64 .. 16 * 4**10."""
    if isinstance(neurons, bool) or not isinstance(neurons, int | np.integer):
        raise ValueError(f"neurons must be an integer, got {neurons!r}")
    neurons = int(neurons)
    m = neurons // KRON
    ok = (
        64 <= neurons <= MAX_NEURONS
        and neurons % KRON == 0
        and m & (m - 1) == 0
        and (m.bit_length() - 1) % 2 == 0
    )
    if not ok:
        allowed = ", ".join(str(KRON * 4**e) for e in range(1, 8))
        raise ValueError(
            f"neurons must be 16 * 4**m (m >= 1, at most {MAX_NEURONS}): {allowed}, ...; "
            f"got {neurons}"
        )
    return m.bit_length() - 1


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _check_shuffle(shuffle: str) -> None:
    if shuffle not in SHUFFLE_MODES:
        raise ValueError(f"shuffle must be one of {', '.join(SHUFFLE_MODES)}, got {shuffle!r}")


def layer_relabelling(
    neurons: int, layer: int, seed: int, shuffle: str = "cycle"
) -> np.ndarray | None:
    """Row relabelling of 1-based ``layer``: base row t becomes row ``q[t]``; None if unshuffled.
    Seeded by (seed, N, mode, cycle or layer), so any layer can be rebuilt on its own."""
    n_base = base_layer_count(neurons)
    seed = _check_seed(seed)
    _check_shuffle(shuffle)
    if layer < 1:
        raise ValueError(f"layers are numbered from 1, got {layer}")
    if layer <= n_base:
        return None
    mode = SHUFFLE_MODES.index(shuffle)
    key = (layer - 1) // n_base if shuffle == "cycle" else layer
    rng = np.random.default_rng(np.random.SeedSequence([seed, neurons, mode, key]))
    return rng.permutation(neurons)


def _residue_rows(neurons: int, base: int, relabel: np.ndarray | None) -> np.ndarray:
    """(M, 32) sorted inputs of the outputs with residue s = 0 .. M-1 (mod M)."""
    m = neurons // KRON
    q = np.arange(neurons) if relabel is None else relabel
    # Inputs whose base row is congruent to t (mod M): q[t + b*M], b = 0..15.
    group = np.sort(q.reshape(KRON, m).T, axis=1)
    # Output residue s is fed by base rows congruent to s and to s + 2**(base-1).
    shift = 1 << (base - 1)
    both = np.concatenate([group, np.roll(group, -shift, axis=0)], axis=1)
    both.sort(axis=1)
    return both


def radixnet_layer(neurons: int, layer: int, seed: int = 0, shuffle: str = "cycle") -> Layer:
    """1-based ``layer`` of the seeded challenge-shaped network on ``neurons`` neurons."""
    n_base = base_layer_count(neurons)
    relabel = layer_relabelling(neurons, layer, seed, shuffle)
    rows = _residue_rows(neurons, (layer - 1) % n_base + 1, relabel)
    indices = np.tile(rows.astype(index_dtype(neurons), copy=False).ravel(), KRON)
    indptr = np.arange(0, DEGREE * neurons + 1, DEGREE, dtype=np.int64)
    return Layer(
        neurons,
        neurons,
        indptr,
        indices,
        values=None,
        uniform_value=CHALLENGE_WEIGHT,
        bias=challenge_bias(neurons),
        clip=CHALLENGE_CLIP,
    )


def iter_radixnet(
    neurons: int, n_layers: int, seed: int = 0, shuffle: str = "cycle", first: int = 1
) -> Iterator[Layer]:
    """Layers ``first .. first + n_layers - 1`` one at a time, so callers can stream them
    (arguments checked before the first is asked for)."""
    base_layer_count(neurons)
    _check_seed(seed)
    _check_shuffle(shuffle)
    if n_layers < 1 or first < 1:
        raise ValueError(f"n_layers and first must be >= 1, got {n_layers} and {first}")
    return (radixnet_layer(neurons, k, seed, shuffle) for k in range(first, first + n_layers))


def radixnet_network(neurons: int, n_layers: int, seed: int = 0, shuffle: str = "cycle") -> Network:
    """The whole network in memory (small cases; stream big ones with ``iter_radixnet``)."""
    layers = list(iter_radixnet(neurons, n_layers, seed, shuffle))
    return Network(layers, radixnet_provenance(neurons, n_layers, seed, shuffle))


def radixnet_provenance(neurons: int, n_layers: int, seed: int, shuffle: str) -> dict:
    """What a store records about a generated network."""
    return {
        "network": "radixnet",
        "neurons": neurons,
        "layers": n_layers,
        "seed": seed,
        "shuffle": shuffle,
        "base_layers": base_layer_count(neurons),
        "kron": KRON,
    }
