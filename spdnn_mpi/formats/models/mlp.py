"""Dense MLP layers read from model files (``DenseLayer``, named after their node or
tensors for messages), checked and turned into the store's sparse layers."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from spdnn_mpi.errors import ModelFormatError
from spdnn_mpi.model import ACTIVATIONS, Layer, Network


@dataclass
class DenseLayer:
    """One linear layer ``act(x @ weight + bias)`` as read from a model file."""

    name: str  # node or tensor prefix, for messages
    weight: np.ndarray  # (n_in, n_out)
    bias: np.ndarray  # (n_out,)
    activation: str = "none"

    @property
    def n_in(self) -> int:
        return int(self.weight.shape[0])

    @property
    def n_out(self) -> int:
        return int(self.weight.shape[1])


def to_float32(array: np.ndarray) -> np.ndarray:
    """``array`` cast to float32 without numpy's overflow warning: a value beyond
    float32's range becomes inf, which the caller's finiteness check refuses."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(array).astype(np.float32)


def as_float32(path: str | os.PathLike, where: str, array: np.ndarray) -> np.ndarray:
    """``array`` as float32, refusing non-float types and values not finite as float32."""
    array = np.asarray(array)
    if not np.issubdtype(array.dtype, np.floating):
        raise ModelFormatError(path, where, f"values of type {array.dtype}, expected floats")
    out = to_float32(array)
    bad = ~np.isfinite(out)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ModelFormatError(path, where, f"{int(bad.sum())} NaN or infinite values as "
                                            f"float32 (first at index {first})")
    return out


def check_chain(path: str | os.PathLike, layers: list[DenseLayer],
                n_inputs: int | None = None) -> None:
    """Each layer's inputs equal the previous layer's outputs (and the model's inputs)."""
    if not layers:
        raise ModelFormatError(path, None, "no linear layers found")
    width = n_inputs
    for k, layer in enumerate(layers):
        if layer.weight.ndim != 2:
            raise ModelFormatError(path, layer.name, f"weight has shape {layer.weight.shape}, "
                                                     "expected 2 dimensions")
        if layer.n_in < 1 or layer.n_out < 1:
            raise ModelFormatError(path, layer.name, f"has {layer.n_in} inputs and "
                                                     f"{layer.n_out} outputs; a layer needs "
                                                     "at least one of each")
        if layer.bias.shape != (layer.n_out,):
            raise ModelFormatError(path, layer.name, f"bias has shape {layer.bias.shape}, "
                                                     f"expected ({layer.n_out},)")
        if layer.activation not in ACTIVATIONS:
            raise ModelFormatError(path, layer.name, f"activation {layer.activation!r} is "
                                                     "not supported (ReLU or none)")
        if width is not None and layer.n_in != width:
            what = "the model's input" if k == 0 else f"layer {k} ({layers[k - 1].name})"
            raise ModelFormatError(path, layer.name, f"takes {layer.n_in} inputs but {what} "
                                                     f"has {width} features")
        width = layer.n_out


def sparse_layer(layer: DenseLayer) -> Layer:
    """The store's layer: CSR of W^T with the zeros dropped, bias, activation, no clip."""
    w = np.asarray(layer.weight, dtype=np.float32)
    rows_in, cols_out = np.nonzero(w)
    bias = np.asarray(layer.bias, dtype=np.float32)
    return Layer.from_coo(rows_in, cols_out, w[rows_in, cols_out], layer.n_in, layer.n_out,
                          bias=bias, clip=None, activation=layer.activation)


def dense_network(path: str | os.PathLike, layers: list[DenseLayer],
                  n_inputs: int | None = None) -> Network:
    """Check the chain and build the argmax-readout network the store will hold."""
    check_chain(path, layers, n_inputs)
    return Network([sparse_layer(layer) for layer in layers], readout="argmax")


def sparsity(network: Network) -> float:
    """Fraction of zero weights over all layers (0 for a dense model)."""
    total = sum(layer.n_in * layer.n_out for layer in network.layers)
    return 1.0 - network.edges() / total if total else 0.0
