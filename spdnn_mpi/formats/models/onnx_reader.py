"""Read an MLP from an ONNX file: a chain of Gemm, or MatMul then Add, each optionally then Relu.

Also accepted: a leading Cast to float, Identity nodes, and after the last layer a
classifier head that keeps the argmax of the logits (Softmax, ArgMax, skl2onnx's
label nodes). Anything else is refused with the node's name.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import ModelFormatError, SpdnnError
from spdnn_mpi.formats.models.mlp import DenseLayer, as_float32

#: Nodes allowed after the last layer: they only turn logits into labels.
HEAD_OPS = ("Softmax", "LogSoftmax")
LABEL_OPS = ("Identity", "ArgMax", "ArrayFeatureExtractor", "Reshape", "Cast", "ZipMap")
_FLOAT = 1  # onnx.TensorProto.FLOAT


def _onnx():
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:
        raise SpdnnError(f"reading ONNX needs the onnx package ({exc.name} missing): "
                         "pip install 'spdnn_mpi[models]'") from None
    return onnx, numpy_helper


def load_model_proto(path: str | os.PathLike):
    """The ModelProto of ``path`` (plain or gzip-compressed), with a clear error if unreadable."""
    onnx, _ = _onnx()
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelFormatError(path, None, f"cannot read ({exc.strerror or exc})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise ModelFormatError(path, None, f"bad gzip data ({exc})") from None
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ModelFormatError(path, None, f"not an ONNX model ({type(exc).__name__})") from None
    if not model.graph.node:
        raise ModelFormatError(path, None, "not an ONNX model (its graph has no nodes)")
    _load_external_data(path, model)
    return model


def _load_external_data(path: Path, model) -> None:
    """Read the weights stored beside the model (external data), naming a tensor whose
    file is missing, unreadable or outside the model's folder."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    graph = model.graph
    tensors = list(graph.initializer)
    tensors += [t for sp in graph.sparse_initializer for t in (sp.values, sp.indices)]
    tensors += [a.t for node in graph.node for a in node.attribute if a.HasField("t")]
    for tensor in tensors:
        if not uses_external_data(tensor):
            continue
        try:
            load_external_data_for_tensor(tensor, str(path.parent))
        except Exception as exc:  # onnx's ValidationError, OSError, ValueError
            reason = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ModelFormatError(path, None, f"external weights of tensor '{tensor.name}' "
                                               f"not readable ({reason})") from None
        tensor.data_location = 0  # DEFAULT: the data is in the tensor now
        del tensor.external_data[:]


class _Graph:
    """Initializers, constants and consumers of one ONNX graph."""

    def __init__(self, path: Path, model) -> None:
        _, nh = _onnx()
        self.path = path
        graph = model.graph
        self.const: dict[str, np.ndarray] = {t.name: nh.to_array(t) for t in graph.initializer}
        for sp in graph.sparse_initializer:
            self.const[sp.values.name] = _sparse_to_dense(path, sp, nh)
        self.nodes = list(graph.node)
        for node in self.nodes:
            if node.op_type == "Constant":
                value = [a for a in node.attribute if a.name == "value"]
                if not value:
                    raise ModelFormatError(path, _node_name(node), "Constant without a tensor "
                                                                   "value is not supported")
                self.const[node.output[0]] = nh.to_array(value[0].t)
        self.consumers: dict[str, list] = {}
        for node in self.nodes:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        inputs = [i for i in graph.input if i.name not in self.const]
        if len(inputs) != 1:
            raise ModelFormatError(path, None, f"the graph has {len(inputs)} inputs "
                                               f"({', '.join(i.name for i in inputs)}); "
                                               "an MLP has one")
        self.input = inputs[0]
        self.outputs = {o.name for o in graph.output}
        self._check_single_writers({t.name for t in graph.initializer})

    def _check_single_writers(self, stored: set[str]) -> None:
        """Refuse a tensor written twice, or the graph's input or a stored weight written
        (one writer a tensor is what makes the walk along consumers end: no cycle)."""
        writer: dict[str, object] = {}
        for node in self.nodes:
            for name in node.output:
                if not name:
                    continue
                if name == self.input.name:
                    raise ModelFormatError(self.path, _node_name(node), "writes the graph's "
                                           f"input '{name}': a cycle, an MLP is one chain")
                if name in stored:
                    raise ModelFormatError(self.path, _node_name(node), "writes the stored "
                                           f"tensor '{name}': an MLP is one chain")
                if name in writer:
                    raise ModelFormatError(self.path, _node_name(node), f"writes '{name}', "
                                           f"which {_node_name(writer[name])} writes too")
                writer[name] = node

    def weight(self, node, index: int, what: str) -> np.ndarray:
        name = node.input[index] if index < len(node.input) else ""
        if name not in self.const:
            raise ModelFormatError(self.path, _node_name(node),
                                   f"{what} '{name}' is not a stored initializer "
                                   "(weights computed in the graph are not supported)")
        return as_float32(self.path, f"tensor '{name}'", self.const[name])

    def n_features(self) -> int | None:
        dims = self.input.type.tensor_type.shape.dim
        if len(dims) >= 1 and dims[-1].HasField("dim_value"):
            return int(dims[-1].dim_value)
        return None


def _sparse_to_dense(path: Path, sp, nh) -> np.ndarray:
    """A sparse initializer as a dense array; indices out of range or not matching the
    values are refused (numpy would raise IndexError)."""
    where = f"sparse initializer '{sp.values.name}'"
    values = nh.to_array(sp.values).reshape(-1)
    indices = nh.to_array(sp.indices).astype(np.int64)
    shape = tuple(int(d) for d in sp.dims)
    size = int(np.prod(shape, dtype=np.int64))
    if indices.ndim == 2 and indices.shape[1:] == (len(shape),):  # one row of coordinates each
        flat = (np.ravel_multi_index(tuple(indices.T), shape)
                if len(indices) and (indices >= 0).all() and (indices < shape).all() else None)
        if len(indices) and flat is None:
            raise ModelFormatError(path, where, f"indices outside shape {shape}")
        indices = flat if flat is not None else np.zeros(0, np.int64)
    if indices.ndim != 1 or len(indices) != len(values):
        raise ModelFormatError(path, where, f"{indices.shape} indices for {len(values)} values")
    bad = np.flatnonzero((indices < 0) | (indices >= size))
    if len(bad):
        raise ModelFormatError(path, where, f"index {int(indices[bad[0]])} outside the {size} "
                                            f"values of shape {shape}")
    dense = np.zeros(size, dtype=values.dtype)
    dense[indices] = values
    return dense.reshape(shape)


def _node_name(node) -> str:
    return f"node '{node.name or node.output[0]}' ({node.op_type})"


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _bias_vector(path, node, bias: np.ndarray, n_out: int, what: str) -> np.ndarray:
    if bias.size == 1:
        return np.full(n_out, bias.reshape(-1)[0], dtype=np.float32)
    if bias.shape in ((n_out,), (1, n_out)):
        return bias.reshape(n_out).astype(np.float32)
    raise ModelFormatError(path, _node_name(node), f"{what} of shape {bias.shape} does not "
                                                   f"broadcast to one value per output ({n_out})")


def _scale(g: _Graph, node, attrs: dict, name: str) -> np.float32:
    """Gemm's ``alpha`` or ``beta`` as float32, refused when not finite."""
    value = float(attrs.get(name, 1.0))
    if not np.isfinite(value):
        raise ModelFormatError(g.path, _node_name(node), f"{name}={value} is not a finite "
                                                         "number")
    return np.float32(value)


def _scaled(g: _Graph, node, array: np.ndarray, scale: np.float32, what: str) -> np.ndarray:
    """``array * scale`` as contiguous float32, refused where a product is not finite."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(array * scale, dtype=np.float32)
    return as_float32(g.path, f"{_node_name(node)}: {what}", out)


def _gemm(g: _Graph, node) -> DenseLayer:
    a = _attrs(node)
    if a.get("transA", 0):
        raise ModelFormatError(g.path, _node_name(node), "transA=1 is not supported")
    w = g.weight(node, 1, "B")
    if w.ndim != 2:
        raise ModelFormatError(g.path, _node_name(node), f"B has shape {w.shape}, expected 2-D")
    if a.get("transB", 0):
        w = w.T
    alpha, beta = _scale(g, node, a, "alpha"), _scale(g, node, a, "beta")
    w = _scaled(g, node, w, alpha, "B x alpha")
    if len(node.input) > 2 and node.input[2]:
        c = _scaled(g, node, g.weight(node, 2, "C"), beta, "C x beta")
        bias = _bias_vector(g.path, node, c, w.shape[1], "C")
    else:
        bias = np.zeros(w.shape[1], np.float32)
    return DenseLayer(_node_name(node), w, bias)


def _matmul(g: _Graph, node, cur: str) -> DenseLayer:
    if node.input[0] != cur:
        raise ModelFormatError(g.path, _node_name(node), "the weight comes first "
                                                         "(W @ x): not an x @ W layer")
    w = g.weight(node, 1, "weight")
    if w.ndim != 2:
        raise ModelFormatError(g.path, _node_name(node), f"weight has shape {w.shape}, "
                                                         "expected 2-D")
    return DenseLayer(_node_name(node), w, np.zeros(w.shape[1], np.float32))


def _add_bias(g: _Graph, node, cur: str, layer: DenseLayer) -> None:
    other = [i for i in node.input if i != cur]
    if len(other) != 1 or len(node.input) != 2:
        raise ModelFormatError(g.path, _node_name(node), "adds the layer's output to itself")
    index = list(node.input).index(other[0])
    bias = g.weight(node, index, "addend")
    layer.bias = layer.bias + _bias_vector(g.path, node, bias, layer.n_out, "addend")


def _check_label_node(g: _Graph, node, n_classes: int) -> None:
    a = _attrs(node)
    if node.op_type == "ArgMax" and (a.get("axis", 0) not in (1, -1)
                                     or a.get("select_last_index", 0)):
        raise ModelFormatError(g.path, _node_name(node), "ArgMax must be over the last axis "
                                                         "with ties to the first index")
    if node.op_type == "ArrayFeatureExtractor":
        classes = g.const.get(node.input[0])
        if classes is None or not np.array_equal(np.asarray(classes).reshape(-1),
                                                 np.arange(n_classes)):
            raise ModelFormatError(g.path, _node_name(node),
                                   f"class labels are not 0..{n_classes - 1}: "
                                   "stores hold class indices")
    if node.op_type in HEAD_OPS and a.get("axis", -1) not in (1, -1):
        raise ModelFormatError(g.path, _node_name(node), "softmax over an axis other than "
                                                         "the last changes the argmax")


def read_onnx(path: str | os.PathLike) -> tuple[list[DenseLayer], dict]:
    """(dense layers in order, facts about the file) of the MLP in an ONNX file."""
    path = Path(path)
    model = load_model_proto(path)
    g = _Graph(path, model)
    layers: list[DenseLayer] = []
    seen: set[int] = set()
    cur = g.input.name
    head = None
    while True:
        nodes = g.consumers.get(cur, [])
        if not nodes:
            break
        if any(id(n) in seen for n in nodes):  # unreachable with one writer per tensor
            raise ModelFormatError(path, _node_name(nodes[0]), "is reached twice: a cycle")
        if len(nodes) > 1 and not (layers and all(n.op_type in HEAD_OPS + LABEL_OPS
                                                  for n in nodes)):
            names = ", ".join(_node_name(n) for n in nodes)
            raise ModelFormatError(path, _node_name(nodes[1]), f"the chain branches at "
                                   f"'{cur}' ({names}); an MLP is one chain")
        node = nodes[0]
        op = node.op_type
        if len(nodes) > 1 or op in HEAD_OPS or (layers and op in LABEL_OPS[1:]):
            break  # the classifier head, checked below
        seen.add(id(node))
        if op == "Identity" or (op == "Cast" and not layers and _attrs(node).get("to") == _FLOAT):
            pass
        elif op == "Gemm":
            layers.append(_gemm(g, node))
        elif op == "MatMul":
            layers.append(_matmul(g, node, cur))
        elif op == "Add" and layers and layers[-1].activation == "none":
            _add_bias(g, node, cur, layers[-1])
        elif op == "Relu" and layers and layers[-1].activation == "none":
            layers[-1].activation = "relu"
        elif op in ("Add", "Relu"):
            raise ModelFormatError(path, _node_name(node), f"{op} not after a linear layer")
        else:
            raise ModelFormatError(path, _node_name(node),
                                   f"{op} is not supported: spdnn import reads chains of "
                                   "Gemm, MatMul + Add and Relu (activations other than "
                                   "ReLU, convolutions and reshapes are refused)")
        cur = node.output[0]
    logits = cur
    n_classes = layers[-1].n_out if layers else 0
    tail, todo = set(), [logits]
    while todo:
        for node in g.consumers.get(todo.pop(), []):
            if id(node) in tail or id(node) in seen:
                continue
            tail.add(id(node))
            if node.op_type not in HEAD_OPS + LABEL_OPS:
                raise ModelFormatError(path, _node_name(node), f"{node.op_type} after the last "
                                       "layer is not supported (only Softmax, ArgMax and "
                                       "label nodes may follow the logits)")
            if node.op_type == "Softmax" or node.op_type == "LogSoftmax":
                head = node.op_type
            _check_label_node(g, node, n_classes)
            todo.extend(node.output)
    for node in g.nodes:
        if id(node) not in seen and id(node) not in tail and node.op_type != "Constant":
            raise ModelFormatError(path, _node_name(node), "is not part of the MLP chain")
    info = {
        "format": "onnx",
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opset": max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                     default=None),
        "input": g.input.name,
        "logits": logits,
        "head": head,
        "n_features": g.n_features(),
    }
    return layers, info
