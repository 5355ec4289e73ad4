"""Small argmax-readout stores for tests (no ONNX needed): random classifiers."""

from __future__ import annotations

import numpy as np
from conftest import random_inputs, random_network

from spdnn_mpi.formats.models.importer import write_model_store
from spdnn_mpi.reference import reference_predictions


def classifier_store(path, seed=31, n_images=257, widths=(40, 64, 32, 10), labels=True):
    """Write a random classifier store (ReLU hidden layers, linear output) and return
    (network, rows, reference predictions, labels)."""
    rng = np.random.default_rng(seed)
    widths = list(widths)
    net = random_network(rng, widths, 0.3, bias="positive", clip=None,
                         activations=["relu"] * (len(widths) - 2) + ["none"])
    net.readout = "argmax"
    rows = random_inputs(rng, n_images, widths[0], 0.3, binary=False)
    preds = reference_predictions(net, rows)
    y = preds.copy()
    y[::4] = (y[::4] + 1) % widths[-1]  # every fourth image mislabelled: 75 % accuracy
    write_model_store(path, net, rows, y if labels else None, preds)
    return net, rows, preds, y
