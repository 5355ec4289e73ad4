"""Read an MLP from a safetensors file of PyTorch ``nn.Linear`` layers.

Layers come in file order unless ``layer_order`` names them; names ending in numbers
the file order does not follow (writers sort by name: ``layers.10`` before
``layers.2``) are refused rather than guessed. Activations: ReLU after every layer
but the last, unless ``activations`` says otherwise.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import ModelFormatError, SpdnnError
from spdnn_mpi.formats.models.mlp import DenseLayer, as_float32

#: Tensor types this reader converts to float32.
FLOAT_DTYPES = ("F16", "F32", "F64")
_MAX_HEADER = 100 << 20


def read_header(path: Path) -> dict:
    """The JSON header of a safetensors file: tensor name -> dtype, shape, data_offsets."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise ModelFormatError(path, None, "not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise ModelFormatError(path, None, "not a safetensors file (header length "
                                                   f"{n} bytes)")
            header = json.loads(fh.read(n))
    except OSError as exc:
        raise ModelFormatError(path, None, f"cannot read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelFormatError(path, None, "not a safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise ModelFormatError(path, None, "not a safetensors file (header is not an object)")
    header.pop("__metadata__", None)
    for name, entry in header.items():
        _check_entry(path, name, entry)
    return header


def _check_entry(path: Path, name: str, entry) -> None:
    """Refuse a tensor's header entry that is not an object with a shape (a list of sizes)
    and data_offsets (two integers)."""
    where = f"tensor '{name}'"
    if not isinstance(entry, dict):
        raise ModelFormatError(path, where, f"header entry is not an object ({entry!r:.60})")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(_size(d) for d in shape):
        raise ModelFormatError(path, where, f"shape {shape!r:.60} is not a list of sizes")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_size, offsets)):
        raise ModelFormatError(path, where, f"data_offsets {offsets!r:.60} is not two "
                                            "integers")


def _size(value) -> bool:
    """True for a JSON integer >= 0 (not a bool, float or string)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _load_tensors(path: Path) -> dict[str, np.ndarray]:
    try:
        from safetensors.numpy import load_file
    except ImportError as exc:
        raise SpdnnError(f"reading safetensors needs the safetensors package ({exc.name} "
                         "missing): pip install 'spdnn_mpi[models]'") from None
    try:
        return load_file(str(path))
    except Exception as exc:  # SafetensorError and friends
        raise ModelFormatError(path, None, f"cannot read tensors ({exc})") from None


def _layer_names(path: Path, header: dict) -> dict[str, dict[str, str]]:
    """prefix -> {"weight": tensor, "bias": tensor}, in file order."""
    order = sorted(header, key=lambda name: header[name]["data_offsets"][0])
    layers: dict[str, dict[str, str]] = {}
    for name in order:
        prefix, _, kind = name.rpartition(".")
        where = f"tensor '{name}'"
        if kind not in ("weight", "bias") or not prefix:
            raise ModelFormatError(path, where, "is not an nn.Linear weight or bias "
                                                "(NAME.weight, NAME.bias)")
        dtype = header[name].get("dtype")
        if dtype not in FLOAT_DTYPES:
            raise ModelFormatError(path, where, f"dtype {dtype} is not supported "
                                                f"({', '.join(FLOAT_DTYPES)})")
        shape = header[name]["shape"]
        want = 2 if kind == "weight" else 1
        if len(shape) != want:
            what = " (a convolution?)" if kind == "weight" and len(shape) > 2 else ""
            raise ModelFormatError(path, where, f"has shape {tuple(shape)}, expected {want} "
                                                f"dimension(s) for an nn.Linear {kind}{what}")
        layers.setdefault(prefix, {})[kind] = name
    for prefix, parts in layers.items():
        if "weight" not in parts:
            raise ModelFormatError(path, f"tensor '{parts['bias']}'", f"has no {prefix}.weight")
    return layers


def _check_numbered_order(path: Path, prefixes: list[str]) -> None:
    numbers = [re.search(r"(\d+)$", p) for p in prefixes]
    if len(prefixes) > 1 and all(numbers):
        values = [int(m.group(1)) for m in numbers]
        if values != sorted(values):
            k = next(i for i in range(1, len(values)) if values[i] < values[i - 1])
            raise ModelFormatError(path, None, f"layer names '{prefixes[k - 1]}' and "
                                   f"'{prefixes[k]}' end in numbers the file order does not "
                                   "follow; give the order with --layer-order")


def read_safetensors(path: str | os.PathLike, layer_order: list[str] | None = None,
                     activations: list[str] | None = None) -> tuple[list[DenseLayer], dict]:
    """(dense layers in order, facts about the file) of the nn.Linear stack in ``path``."""
    path = Path(path)
    header = read_header(path)
    by_prefix = _layer_names(path, header)
    if layer_order:
        missing = [p for p in layer_order if p not in by_prefix]
        if missing:
            raise ModelFormatError(path, None, f"--layer-order names '{missing[0]}' but the "
                                   f"file has no tensor {missing[0]}.weight")
        left = [p for p in by_prefix if p not in layer_order]
        if left:
            raise ModelFormatError(path, f"tensor '{by_prefix[left[0]]['weight']}'",
                                   "is not in --layer-order")
        if len(set(layer_order)) != len(layer_order):
            raise ModelFormatError(path, None, "--layer-order names a layer twice")
        prefixes = list(layer_order)
    else:
        prefixes = list(by_prefix)
        _check_numbered_order(path, prefixes)
    if not prefixes:
        raise ModelFormatError(path, None, "no tensors")
    acts = activations or ["relu"] * (len(prefixes) - 1) + ["none"]
    if len(acts) != len(prefixes):
        raise ModelFormatError(path, None, f"{len(acts)} activations given for "
                                           f"{len(prefixes)} layers")
    tensors = _load_tensors(path)
    layers = []
    for prefix, act in zip(prefixes, acts):
        names = by_prefix[prefix]
        w = as_float32(path, f"tensor '{names['weight']}'", tensors[names["weight"]])
        if "bias" in names:
            b = as_float32(path, f"tensor '{names['bias']}'", tensors[names["bias"]])
            if b.shape != (w.shape[0],):
                raise ModelFormatError(path, f"tensor '{names['bias']}'",
                                       f"has shape {b.shape}; {names['weight']} has "
                                       f"{w.shape[0]} outputs")
        else:
            b = np.zeros(w.shape[0], np.float32)
        layers.append(DenseLayer(f"layer '{prefix}'", np.ascontiguousarray(w.T), b, act))
    info = {"format": "safetensors", "layer_order": prefixes, "activations": acts,
            "n_features": None}
    return layers, info
