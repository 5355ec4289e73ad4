"""Per-layer activations (ReLU or none) and the argmax readout, on every CPU backend.

The dead-row rule must stay exact: a row is dropped only where every later
layer maps zero to zero, and a row is alive when any value is nonzero
(negative outputs of a linear layer included).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import random_inputs, random_network

from spdnn_mpi.backends import make_backend
from spdnn_mpi.engine import run_inference
from spdnn_mpi.model import Layer, Network, SparseRows
from spdnn_mpi.readout import accuracy, classes_of_rows, compare_predictions
from spdnn_mpi.reference import (
    droppable_after,
    forward_dense,
    reference_infer,
    reference_predictions,
)

BACKENDS = ["cpu", "reference"]


def dense_layer(w: np.ndarray, b, activation: str, clip=None) -> Layer:
    i, j = np.nonzero(w)
    return Layer.from_coo(i, j, w[i, j], w.shape[0], w.shape[1], bias=b, clip=clip,
                          activation=activation)


def run(net: Network, rows: SparseRows, name: str):
    backend = make_backend(name)
    backend.load_network(net.layers)
    return run_inference(net, rows, backend, want_features=True)


@pytest.mark.parametrize("activation,bias,clip,expected", [
    ("relu", -0.5, None, True), ("relu", 0.0, 32.0, True), ("relu", 0.1, None, False),
    ("none", 0.0, None, True), ("none", -0.5, None, False), ("none", 0.2, 32.0, False),
    ("relu", -0.5, -1.0, False),  # a negative clip sends 0 to the clip
])
def test_maps_zero_to_zero_depends_on_the_activation(activation, bias, clip, expected):
    layer = dense_layer(np.eye(3, dtype=np.float32), bias, activation, clip)
    assert layer.maps_zero_to_zero is expected
    assert layer.floor == (0.0 if activation == "relu" else -math.inf)


def test_vector_bias_rule_for_none():
    w = np.eye(3, dtype=np.float32)
    assert dense_layer(w, np.zeros(3, np.float32), "none").maps_zero_to_zero
    assert not dense_layer(w, np.array([0, 0, -1e-3], np.float32), "none").maps_zero_to_zero


def test_unknown_activation_and_readout_are_refused():
    w = np.eye(2, dtype=np.float32)
    with pytest.raises(ValueError, match="activation 'tanh'"):
        dense_layer(w, 0.0, "tanh")
    with pytest.raises(ValueError, match="readout 'max'"):
        Network([dense_layer(w, 0.0, "relu")], readout="max")


def test_no_dropping_before_a_linear_layer_with_a_bias():
    rng = np.random.default_rng(1)
    net = random_network(rng, [20, 20, 20, 5], 0.3, bias="vector",
                         activations=["relu", "relu", "none"])
    for layer in net.layers[:2]:
        layer.bias = -np.abs(layer.bias_vector())
    assert droppable_after(net) == [False, False, False, True]
    net.layers[2].bias = 0.0
    assert droppable_after(net) == [True, True, True, True]


@pytest.mark.parametrize("name", BACKENDS)
def test_rows_dead_after_relu_come_back_through_a_biased_linear_layer(name):
    """Layer 1 kills every row; layer 2 (no activation, bias) revives them all."""
    w1 = np.ones((4, 3), np.float32)
    w2 = np.array([[1.0, -1.0], [0.5, 0.0], [0.0, 2.0]], np.float32)
    net = Network([dense_layer(w1, -100.0, "relu"),
                   dense_layer(w2, np.array([0.25, -0.75], np.float32), "none")],
                  readout="argmax")
    rows = SparseRows.from_dense(np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0]])
    res = run(net, rows, name)
    assert res.live_per_layer.tolist() == [0, 5]
    np.testing.assert_array_equal(res.alive_ids, np.arange(5))
    np.testing.assert_array_equal(res.features, np.tile([[0.25, -0.75]], (5, 1)))
    np.testing.assert_array_equal(reference_predictions(net, rows), np.zeros(5))


@pytest.mark.parametrize("name", BACKENDS)
def test_negative_outputs_count_as_alive(name):
    w = np.array([[-1.0, 0.0], [0.0, -2.0], [0.0, 0.0]], np.float32)
    net = Network([dense_layer(w, 0.0, "none")])
    dense = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], np.float32)
    rows = SparseRows.from_dense(dense)
    res = run(net, rows, name)
    np.testing.assert_array_equal(res.alive_ids, [0, 1, 3])  # row 2 is all zero
    np.testing.assert_array_equal(res.features, [[-1, 0], [0, -2], [-1, -2]])


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("seed", range(6))
def test_random_classifiers_match_the_dense_forward_pass(name, seed):
    """Hidden ReLU layers, a linear output, vector biases, valued inputs, no clip."""
    rng = np.random.default_rng(seed)
    widths = [int(x) for x in rng.integers(5, 70, 4)] + [int(rng.integers(2, 12))]
    net = random_network(rng, widths, 0.3, bias="positive", clip=None,
                         activations=["relu"] * 3 + ["none"])
    net.readout = "argmax"
    rows = random_inputs(rng, 130, widths[0], 0.3, binary=False)
    res = run(net, rows, name)
    full = forward_dense(net, rows.to_dense())
    ours = classes_of_rows(rows.n_rows, res.alive_ids, res.features)
    np.testing.assert_array_equal(ours, np.argmax(full, axis=1))
    np.testing.assert_array_equal(ours, reference_predictions(net, rows))
    ids, feats = reference_infer(net, rows)
    np.testing.assert_array_equal(res.alive_ids, ids)
    np.testing.assert_allclose(res.features, feats, rtol=1e-5, atol=1e-5)


def test_classes_ties_and_rows_without_features():
    feats = np.array([[1.0, 3.0, 3.0], [-2.0, -1.0, -1.0]], np.float32)
    classes = classes_of_rows(4, np.array([1, 3]), feats)
    np.testing.assert_array_equal(classes, [0, 1, 0, 1])  # lowest index wins a tie
    assert accuracy(classes, np.array([0, 1, 1, 1])) == 0.75
    cmp = compare_predictions(classes, np.array([0, 1, 2, 1]))
    assert not cmp["passed"] and cmp["differ_first"] == [3] and cmp["differ_count"] == 1
    assert compare_predictions(classes, classes.copy())["passed"]
