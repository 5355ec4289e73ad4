"""What a store says the answers are: truth categories, labels, reference predictions.

A mixin of ``reader.Store``: one dataset ``l<L>`` per layer count L under
``truth`` and ``predictions``, labels beside them; each is validated against
the images and the class count when read.
"""

from __future__ import annotations

import time

import h5py
import numpy as np

from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store import validate
from spdnn_mpi.formats.store.schema import layer_key


class StoredAnswers:
    """Truth, labels and predictions of a store (mixed into ``Store``)."""

    # -- truth and predictions: one dataset l<n_layers> a layer count ------------
    def _stored(self, name: str, n_layers: int) -> tuple[h5py.Group, str] | None:
        """(group, key) of group ``name``'s set for ``n_layers`` layers, if stored."""
        group, key = self._file.get(name), f"l{n_layers}"
        return (group, key) if isinstance(group, h5py.Group) and key in group else None

    def _stored_layers(self, name: str) -> list[int]:
        """The layer counts group ``name`` has a set for."""
        group = self._file.get(name)
        if not isinstance(group, h5py.Group):
            return []
        return sorted(
            validate.integer_attr(f"{self.path}: {d.name[1:]}", d.attrs, "n_layers", 1)
            for d in group.values()
        )

    def _source(self, name: str, n_layers: int) -> str | None:
        """What computed group ``name``'s set for ``n_layers`` layers, if stored."""
        found = self._stored(name, n_layers)
        if found is None:
            return None
        group, key = found
        return str(group[key].attrs.get("computed_by", "unknown"))

    def truth_layers(self) -> list[int]:
        return self._stored_layers("truth")

    def truth(self, n_layers: int) -> np.ndarray | None:
        """Sorted 1-based surviving image ids after ``n_layers`` layers, if stored (validated)."""
        found = self._stored("truth", n_layers)
        if found is None:
            return None
        group, key = found
        ids = self._read(group, key)
        n_images = self.n_images if self.has_inputs else None
        t0 = time.perf_counter()
        validate.check_truth(f"{self.path}: truth/{key}", ids, n_images)
        self._timed(t0)
        return ids

    def truth_source(self, n_layers: int) -> str | None:
        return self._source("truth", n_layers)

    # -- labels and predictions (argmax readout) ----------------------------
    def _classes(self, group: h5py.Group, key: str, what: str, n_layers: int) -> np.ndarray:
        """A per-image class vector, validated: integers, one per image, each below the
        outputs of layer ``n_layers``."""
        where = f"{self.path}: {group.name[1:] + '/' if group.name != '/' else ''}{key}"
        if not 1 <= n_layers <= self.n_layers:
            raise StoreError(f"{where}: for {n_layers} layers, the store has {self.n_layers}")
        n_classes = validate.integer_attr(f"{self.path}: network/{layer_key(n_layers - 1)}",
                                          self._attrs(n_layers - 1), "n_out", 1)
        classes = self._read(group, key)
        whose = "the network" if n_layers == self.n_layers else f"layer {n_layers}"
        validate.check_classes(where, what, classes, self.n_images if self.has_inputs else None,
                               n_classes, whose)
        return classes.astype(np.int64)

    @property
    def has_labels(self) -> bool:
        return isinstance(self._file.get("labels"), h5py.Dataset)

    def labels(self) -> np.ndarray | None:
        """True 0-based class of every image, if stored."""
        if not self.has_labels:
            return None
        return self._classes(self._file, "labels", "labels", self.n_layers)

    def prediction_layers(self) -> list[int]:
        return self._stored_layers("predictions")

    def predictions(self, n_layers: int) -> np.ndarray | None:
        """Stored predicted class of every image after ``n_layers`` layers, if any."""
        found = self._stored("predictions", n_layers)
        return None if found is None else self._classes(*found, "predictions", n_layers)

    def predictions_source(self, n_layers: int) -> str | None:
        return self._source("predictions", n_layers)

