"""A store's input images: their shape, a rank's row range, each row's nonzeros.

A mixin of ``reader.Store`` (it reads through the store's file, ``_read`` and
``_timed``): every row range a rank reads is validated when it is read.
"""

from __future__ import annotations

import shlex
import time

import h5py
import numpy as np

from spdnn_mpi.errors import StoreError
from spdnn_mpi.formats.store import validate
from spdnn_mpi.formats.store.schema import layer_key
from spdnn_mpi.model import SparseRows


class StoredInputs:
    """The input rows of a store (mixed into ``Store``)."""

    def _inputs_group(self) -> h5py.Group:
        group = self._file.get("inputs")
        if not isinstance(group, h5py.Group):
            raise StoreError(self._no_inputs_message())
        return group

    def is_imported_model(self) -> bool:
        """Whether ``spdnn import`` made this store (the argmax readout, or its provenance)."""
        return self.readout == "argmax" or self.provenance.get("tool") == "spdnn import"

    def _no_inputs_message(self) -> str:
        """No inputs, and how to make the store again with them."""
        if self.is_imported_model():
            source = self.provenance.get("source")
            model = source.get("model") if isinstance(source, dict) else None
            return (f"{self.path}: store has no inputs (the model was imported without "
                    f"--inputs); import it again with them: spdnn import "
                    f"{shlex.quote(str(model or 'MODEL'))} --out {shlex.quote(str(self.path))} "
                    "--force --inputs X.npy [--labels y.npy]")
        return (f"{self.path}: store has no inputs (it was prepared from the weights alone); "
                "build it again with inputs: spdnn prepare --weights DIR "
                "--inputs sparse-images-N.tsv (the official images) or --generate-inputs "
                "(MNIST-derived ones), or use spdnn generate")

    @property
    def has_inputs(self) -> bool:
        return "inputs" in self._file

    def _input_shape(self) -> tuple[int, int, int]:
        """(n_rows, n_cols, nnz) of the inputs, checked against the datasets (once)."""
        if self._inputs_meta is not None:
            return self._inputs_meta
        g = self._inputs_group()
        t0 = time.perf_counter()
        first_n_in = validate.integer_attr(f"{self.path}: network/{layer_key(0)}",
                                           self._attrs(0), "n_in", 1)
        n_rows, n_cols, nnz = validate.check_inputs_group(f"{self.path}: inputs", g, first_n_in)
        ends = (int(self._read(g, "indptr", 0)), int(self._read(g, "indptr", n_rows)))
        if ends != (0, nnz):
            raise StoreError(f"{self.path}: inputs/indptr: runs from {ends[0]} to {ends[1]}, "
                             f"expected 0 to {nnz} (the length of inputs/indices)")
        self._timed(t0)
        self._inputs_meta = (n_rows, n_cols, nnz)
        return self._inputs_meta

    @property
    def n_images(self) -> int:
        return self._input_shape()[0]

    @property
    def input_width(self) -> int:
        return self._input_shape()[1]

    def input_row_nnz(self) -> np.ndarray:
        """Nonzeros per input row (reads only the row pointer)."""
        n_rows, _, nnz = self._input_shape()
        indptr = self._read(self._inputs_group(), "indptr")
        t0 = time.perf_counter()
        validate.check_row_pointer(f"{self.path}: inputs", "indptr", indptr, n_rows, nnz)
        self._timed(t0)
        return np.diff(indptr)

    def inputs(self, start: int = 0, stop: int | None = None) -> SparseRows:
        """Input rows ``[start, stop)``, validated; reads only those rows from disk."""
        n_rows, n_cols, nnz = self._input_shape()
        g = self._inputs_group()
        where = f"{self.path}: inputs"
        stop = n_rows if stop is None else stop
        if not 0 <= start <= stop <= n_rows:
            raise StoreError(f"{self.path}: input rows [{start}, {stop}) outside [0, {n_rows})")
        indptr = self._read(g, "indptr", slice(start, stop + 1))
        t0 = time.perf_counter()
        validate.check_row_pointer_slice(where, "indptr", indptr, nnz)
        self._timed(t0)
        lo, hi = int(indptr[0]), int(indptr[-1])
        indices = self._read(g, "indices", slice(lo, hi))
        values = self._read(g, "values", slice(lo, hi)) if "values" in g else None
        t0 = time.perf_counter()
        validate.check_indices(where, "indices", indices, n_cols)
        if values is not None:
            validate.check_finite(where, "values", values)
        self._timed(t0)
        return SparseRows(n_cols, indptr - lo, indices, values, start)

