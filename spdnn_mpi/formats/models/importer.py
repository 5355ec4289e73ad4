"""Import a trained MLP (ONNX or safetensors) into a store, with inputs, labels and the
reference predictions ``spdnn infer --check`` compares with. Everything is checked
before the store is written atomically: a refused model leaves nothing behind.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import InputFormatError, SpdnnError
from spdnn_mpi.formats.models.mlp import DenseLayer, dense_network, sparsity, to_float32
from spdnn_mpi.model import Network, SparseRows
from spdnn_mpi.util.outputs import check_outputs


def model_format(path: Path) -> str:
    """``onnx`` or ``safetensors``, from the name or else the first bytes."""
    name = path.name.lower()
    if name.endswith((".onnx", ".onnx.gz")):
        return "onnx"
    if name.endswith(".safetensors"):
        return "safetensors"
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
    except OSError as exc:
        raise SpdnnError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return "safetensors" if head[8:9] == b"{" else "onnx"


def read_model(path: str | os.PathLike, layer_order: list[str] | None = None,
               activations: list[str] | None = None) -> tuple[list[DenseLayer], dict]:
    """(dense layers, facts about the file) of the MLP in ``path``."""
    path = Path(path)
    if not path.is_file():
        raise SpdnnError(f"{path}: no such model file")
    fmt = model_format(path)
    if fmt == "onnx":
        if layer_order or activations:
            raise SpdnnError("--layer-order and --activations are for safetensors files; an "
                             "ONNX file gives its own order and activations")
        from spdnn_mpi.formats.models.onnx_reader import read_onnx

        return read_onnx(path)
    from spdnn_mpi.formats.models.safetensors_reader import read_safetensors

    return read_safetensors(path, layer_order, activations)


def load_inputs(path: str | os.PathLike | np.ndarray, n_features: int) -> SparseRows:
    """A float .npy (or array) of shape (images, features) as sparse rows, values kept."""
    x, path = (path, "inputs") if isinstance(path, np.ndarray) else (_load_npy(path), path)
    if x.ndim != 2:
        raise InputFormatError(path, None, f"inputs have shape {x.shape}, expected "
                                           "(images, features)")
    if not np.issubdtype(x.dtype, np.floating) and not np.issubdtype(x.dtype, np.integer):
        raise InputFormatError(path, None, f"inputs of type {x.dtype}, expected float32")
    if x.shape[1] != n_features:
        raise InputFormatError(path, None, f"{x.shape[1]} features per image, the model "
                                           f"takes {n_features}")
    x = to_float32(x)
    bad = ~np.isfinite(x)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise InputFormatError(path, None, f"NaN or infinite value as float32 at image "
                                           f"{r + 1}, feature {c + 1}")
    return SparseRows.from_dense(x)  # values kept (stored as binary only when all are 1)


def load_labels(path: str | os.PathLike | np.ndarray, n_images: int,
                n_classes: int) -> np.ndarray:
    """An integer .npy (or array) of one class in 0..n_classes-1 per image."""
    y, path = (path, "labels") if isinstance(path, np.ndarray) else (_load_npy(path), path)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise InputFormatError(path, None, f"labels of shape {y.shape} and type {y.dtype}, "
                                           "expected one integer per image")
    if len(y) != n_images:
        raise InputFormatError(path, None, f"{len(y)} labels for {n_images} images")
    bad = np.flatnonzero((y < 0) | (y >= n_classes))
    if len(bad):
        raise InputFormatError(path, None, f"label {int(y[bad[0]])} of image {bad[0] + 1} "
                                           f"outside 0..{n_classes - 1}")
    return y.astype(np.int64)


def _load_npy(path: str | os.PathLike) -> np.ndarray:
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputFormatError(path, None, "no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise InputFormatError(path, None, f"not a readable .npy array ({exc})") from None
    if not isinstance(data, np.ndarray):  # np.load gives an NpzFile for .npz archives
        data.close()
        raise InputFormatError(path, None, "a .npz archive, not one array: save the inputs "
                                           "with numpy.save (.npy)")
    return data


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _describe(source) -> str | None:
    if source is None:
        return None
    if isinstance(source, np.ndarray):
        return f"array {source.shape} {source.dtype}"
    return str(Path(source).resolve())


def import_model(model: str | os.PathLike, out: str | os.PathLike, *,
                 inputs: str | os.PathLike | np.ndarray | None = None,
                 labels: str | os.PathLike | np.ndarray | None = None,
                 layer_order: list[str] | None = None,
                 activations: list[str] | None = None,
                 force: bool = False, notes: dict | None = None) -> dict:
    """Write the store for ``model`` at ``out``; returns a summary of what was written.
    ``inputs``, ``labels``: .npy paths or arrays; ``notes``: added to the recorded source.
    """
    from spdnn_mpi import __version__
    from spdnn_mpi.reference import reference_predictions

    model, out = Path(model), Path(out)
    sources = {"the model": model, "the --inputs file": inputs, "the --labels file": labels}
    check_outputs({"--out": out}, {what: path for what, path in sources.items()
                                   if not isinstance(path, np.ndarray)}, force=force,
                  regular=True)
    if labels is not None and inputs is None:
        raise SpdnnError("--labels needs --inputs (one label per input image)")
    dense, info = read_model(model, layer_order, activations)
    network = dense_network(model, dense, n_inputs=info.get("n_features"))
    rows = load_inputs(inputs, network.n_inputs) if inputs is not None else None
    n_classes = network.layers[-1].n_out
    y = load_labels(labels, rows.n_rows, n_classes) if labels is not None else None
    predictions = reference_predictions(network, rows) if rows is not None else None
    provenance = {
        "tool": "spdnn import",
        "spdnn_mpi_version": __version__,
        "imported": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "source": {"model": str(model.resolve()), "sha256": file_digest(model),
                   **{k: v for k, v in info.items() if v is not None},
                   "inputs": _describe(inputs), "labels": _describe(labels),
                   **(notes or {})},
        "layers": [{"name": d.name, "n_in": d.n_in, "n_out": d.n_out, "nnz": lay.nnz,
                    "activation": lay.activation} for d, lay in zip(dense, network.layers)],
        "sparsity": round(sparsity(network), 6),
    }
    network.provenance = provenance
    write_model_store(out, network, rows, y, predictions)
    summary = {"store": str(out), "layers": len(network.layers), "edges": network.edges(),
               "sparsity": provenance["sparsity"], "n_inputs": network.n_inputs,
               "n_classes": n_classes, "images": rows.n_rows if rows is not None else 0}
    if y is not None:
        summary["accuracy"] = float(np.mean(predictions == y))
    return summary


def write_model_store(out: Path, network: Network, rows: SparseRows | None,
                      labels: np.ndarray | None, predictions: np.ndarray | None) -> None:
    """One atomic store: layers, readout, inputs, labels and reference predictions."""
    from spdnn_mpi.formats.store.reader import StoreWriter

    with StoreWriter(out, network.provenance, readout=network.readout) as writer:
        for layer in network.layers:
            writer.add_layer(layer)
        if rows is not None:
            writer.write_inputs(rows)
            if labels is not None:
                writer.write_labels(labels)
            if predictions is not None:
                writer.add_predictions(network.n_layers, predictions, "reference")
