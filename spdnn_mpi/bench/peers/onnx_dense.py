"""CPU peer for imported models: the network written back as a standard dense ONNX model
(what a practitioner deploys, zeros multiplied) and run in onnxruntime; only
``session.run`` on densified inputs is timed."""

from __future__ import annotations

import numpy as np

from spdnn_mpi.bench.peers import timed_runs
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.model import Network, SparseRows


def _modules():
    try:
        import onnx
        import onnxruntime
        from onnx import helper, numpy_helper
    except ImportError as exc:
        raise SpdnnError(f"peer onnxruntime needs onnx and onnxruntime ({exc.name} missing): "
                         "pip install 'spdnn_mpi[models]'") from None
    return onnx, onnxruntime, helper, numpy_helper


def dense_onnx(network: Network) -> bytes:
    """The network as a dense ONNX model (input ``x``, output ``y``), serialised."""
    onnx, _, helper, nh = _modules()
    nodes, inits = [], []
    cur = "x"
    for k, layer in enumerate(network.layers):
        w = layer.to_scipy_t().toarray().astype(np.float32)  # (out, in)
        inits += [nh.from_array(w, f"W{k}"), nh.from_array(layer.bias_vector(), f"B{k}")]
        nodes.append(helper.make_node("Gemm", [cur, f"W{k}", f"B{k}"], [f"z{k}"],
                                      name=f"fc{k}", transB=1))
        cur = f"z{k}"
        if layer.activation == "relu":
            nodes.append(helper.make_node("Relu", [cur], [f"r{k}"], name=f"relu{k}"))
            cur = f"r{k}"
        if layer.clip is not None:
            inits.append(nh.from_array(np.array(layer.clip, np.float32), f"C{k}"))
            nodes.append(helper.make_node("Clip", [cur, "", f"C{k}"], [f"c{k}"], name=f"clip{k}"))
            cur = f"c{k}"
    nodes.append(helper.make_node("Identity", [cur], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "dense_mlp",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, network.n_inputs])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT,
                                       [None, network.layers[-1].n_out])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="spdnn_mpi")
    model.ir_version = 8
    return model.SerializeToString()


def onnxruntime_infer(network: Network, rows: SparseRows, *, threads: int | None = None,
                      batch: int | None = None, repeat: int = 3
                      ) -> tuple[np.ndarray, float, list[float]]:
    """(final outputs of every row, median seconds, every run's seconds) in onnxruntime,
    ``batch`` rows a ``run`` call (default: all), after an untimed warm-up."""
    _, ort, _, _ = _modules()
    opts = ort.SessionOptions()
    if threads is not None:
        opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(dense_onnx(network), opts, providers=["CPUExecutionProvider"])
    x = rows.to_dense()
    step = batch or max(1, rows.n_rows)

    def run() -> np.ndarray:
        parts = [sess.run(None, {"x": x[lo:lo + step]})[0] for lo in range(0, len(x), step)]
        return np.concatenate(parts) if parts else np.zeros((0, network.layers[-1].n_out))

    out, median, times = timed_runs(run, repeat)
    return np.asarray(out, dtype=np.float32), median, times
