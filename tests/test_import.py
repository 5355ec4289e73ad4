"""`spdnn import`: ONNX and safetensors MLPs round-trip through the store and the engine.

Models are built here with random sparse weights and biases (onnx helper
functions, safetensors' numpy API); onnxruntime runs the same files. Every
refusal names the node or tensor, exits 2 and writes no store.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from spdnn_mpi.backends import make_backend
from spdnn_mpi.cli import main
from spdnn_mpi.engine import run_inference
from spdnn_mpi.formats.store.reader import Store

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def random_mlp(rng, widths, density=0.3, final="none"):
    """[(W (in, out), b, activation)], sparse random weights, random biases."""
    layers = []
    for k, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        w = (rng.normal(0, 0.5, (n_in, n_out)) * (rng.random((n_in, n_out)) < density))
        b = rng.normal(0, 0.3, n_out)
        act = final if k == len(widths) - 2 else "relu"
        layers.append((w.astype(np.float32), b.astype(np.float32), act))
    return layers


def onnx_mlp(layers, form="gemm", *, alpha=1.0, beta=1.0, trans_b=True):
    """An ONNX model of ``layers``: Gemm (optionally transB, alpha, beta) or MatMul + Add."""
    nodes, inits = [], []
    cur = "x"
    for k, (w, b, act) in enumerate(layers):
        if form == "gemm":
            wt = (w / alpha).T if trans_b else w / alpha
            inits += [numpy_helper.from_array(np.ascontiguousarray(wt, np.float32), f"W{k}"),
                      numpy_helper.from_array((b / beta).astype(np.float32), f"B{k}")]
            nodes.append(helper.make_node("Gemm", [cur, f"W{k}", f"B{k}"], [f"z{k}"],
                                          name=f"gemm{k}", alpha=alpha, beta=beta,
                                          transB=int(trans_b)))
            cur = f"z{k}"
        else:
            inits += [numpy_helper.from_array(w, f"W{k}"),
                      numpy_helper.from_array(b[None, :], f"B{k}")]
            nodes.append(helper.make_node("MatMul", [cur, f"W{k}"], [f"m{k}"], name=f"mm{k}"))
            nodes.append(helper.make_node("Add", [f"m{k}", f"B{k}"], [f"z{k}"], name=f"add{k}"))
            cur = f"z{k}"
        if act == "relu":
            nodes.append(helper.make_node("Relu", [cur], [f"r{k}"], name=f"relu{k}"))
            cur = f"r{k}"
    nodes.append(helper.make_node("Identity", [cur], ["y"], name="out"))
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, layers[0][0].shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, layers[-1][0].shape[1]])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save_safetensors(path, layers, names=None):
    tensors = {}
    for k, (w, b, _) in enumerate(layers):
        name = names[k] if names else f"fc{k}"
        tensors[f"{name}.weight"] = np.ascontiguousarray(w.T)
        tensors[f"{name}.bias"] = b
    safetensors_numpy.save_file(tensors, str(path))


def ort_outputs(model_bytes, x):
    sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def our_outputs(store_path, backend_name="cpu"):
    """(final outputs of every image, predictions, stored predictions) through the engine."""
    with Store(store_path) as st:
        net, rows, stored = st.network(), st.inputs(), st.predictions(st.n_layers)
    backend = make_backend(backend_name)
    backend.load_network(net.layers)
    res = run_inference(net, rows, backend, want_features=True)
    out = np.zeros((rows.n_rows, net.layers[-1].n_out), np.float32)
    out[res.alive_ids] = res.features
    return out, np.argmax(out, axis=1), stored


def assert_close(ours, theirs):
    rel = np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30)
    assert rel <= 1e-5, rel


@pytest.mark.parametrize("form,final,widths", [
    ("gemm", "none", [40, 64, 33, 10]),
    ("matmul", "none", [25, 90, 7]),
    ("gemm", "relu", [30, 30, 12]),
    ("matmul", "relu", [50, 20, 60, 5]),
])
@pytest.mark.parametrize("backend_name", ["cpu", "reference"])
def test_onnx_round_trip_matches_onnxruntime(tmp_path, form, final, widths, backend_name):
    rng = np.random.default_rng(sum(widths) + len(form))
    layers = random_mlp(rng, widths, final=final)
    model = onnx_mlp(layers, form)
    onnx.save(model, tmp_path / "m.onnx")
    x = (rng.random((300, widths[0])) * (rng.random((300, widths[0])) < 0.4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["import", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "m.h5"),
                 "--inputs", str(tmp_path / "x.npy"), "--quiet"]) == 0
    theirs = ort_outputs(model.SerializeToString(), x)
    ours, preds, stored = our_outputs(tmp_path / "m.h5", backend_name)
    assert_close(ours, theirs)
    np.testing.assert_array_equal(preds, np.argmax(theirs, axis=1))
    np.testing.assert_array_equal(stored, preds)
    with Store(tmp_path / "m.h5") as st:
        net = st.network()
        assert [lay.activation for lay in net.layers] == ["relu"] * (len(widths) - 2) + [final]
        assert net.edges() == sum(int(np.count_nonzero(w)) for w, _, _ in layers)


@pytest.mark.parametrize("alpha,beta,trans_b", [(2.0, 0.5, True), (1.0, 1.0, False),
                                                (0.25, 3.0, False)])
def test_gemm_alpha_beta_and_trans_b(tmp_path, alpha, beta, trans_b):
    rng = np.random.default_rng(7)
    layers = random_mlp(rng, [20, 16, 6])
    model = onnx_mlp(layers, "gemm", alpha=alpha, beta=beta, trans_b=trans_b)
    onnx.save(model, tmp_path / "m.onnx")
    x = rng.random((50, 20)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["import", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "m.h5"),
                 "--inputs", str(tmp_path / "x.npy"), "--quiet"]) == 0
    theirs = ort_outputs(model.SerializeToString(), x)
    ours, preds, _ = our_outputs(tmp_path / "m.h5")
    assert_close(ours, theirs)
    np.testing.assert_array_equal(preds, np.argmax(theirs, axis=1))


def test_gzipped_onnx_with_labels_reports_accuracy(tmp_path, capsys):
    rng = np.random.default_rng(8)
    layers = random_mlp(rng, [12, 9, 4])
    model = onnx_mlp(layers, "matmul")
    (tmp_path / "m.onnx.gz").write_bytes(gzip.compress(model.SerializeToString()))
    x = rng.random((40, 12)).astype(np.float32)
    truth = np.argmax(ort_outputs(model.SerializeToString(), x), axis=1)
    y = truth.copy()
    y[:10] = (y[:10] + 1) % 4  # 10 of 40 wrong: 75 %
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    assert main(["import", str(tmp_path / "m.onnx.gz"), "--out", str(tmp_path / "m.h5"),
                 "--inputs", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy")]) == 0
    assert "reference accuracy 75.00%" in capsys.readouterr().out
    with Store(tmp_path / "m.h5") as st:
        np.testing.assert_array_equal(st.labels(), y)
        np.testing.assert_array_equal(st.predictions(2), truth)


@pytest.mark.parametrize("final", ["none", "relu"])
def test_safetensors_round_trip_matches_onnxruntime(tmp_path, final):
    rng = np.random.default_rng(9 if final == "none" else 10)
    layers = random_mlp(rng, [35, 48, 21, 8], final=final)
    save_safetensors(tmp_path / "m.safetensors", layers)
    x = rng.random((120, 35)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    argv = ["import", str(tmp_path / "m.safetensors"), "--out", str(tmp_path / "m.h5"),
            "--inputs", str(tmp_path / "x.npy"), "--quiet"]
    if final == "relu":
        argv += ["--activations", "relu,relu,relu"]
    assert main(argv) == 0
    theirs = ort_outputs(onnx_mlp(layers, "gemm").SerializeToString(), x)
    ours, preds, stored = our_outputs(tmp_path / "m.h5")
    assert_close(ours, theirs)
    np.testing.assert_array_equal(preds, np.argmax(theirs, axis=1))
    np.testing.assert_array_equal(stored, preds)


def test_safetensors_layer_order(tmp_path):
    """Names sort as layers.10 < layers.2: refused without --layer-order, right with it."""
    rng = np.random.default_rng(11)
    widths = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 5]
    layers = random_mlp(rng, widths)
    names = [f"layers.{k}" for k in range(len(layers))]
    save_safetensors(tmp_path / "m.safetensors", layers, names)
    x = rng.random((30, 10)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    argv = ["import", str(tmp_path / "m.safetensors"), "--out", str(tmp_path / "m.h5"),
            "--inputs", str(tmp_path / "x.npy"), "--quiet"]
    assert main(argv) == 2
    assert not (tmp_path / "m.h5").exists()
    assert main(argv + ["--layer-order", ",".join(names)]) == 0
    theirs = ort_outputs(onnx_mlp(layers, "gemm").SerializeToString(), x)
    ours, _, _ = our_outputs(tmp_path / "m.h5")
    assert_close(ours, theirs)


def test_skl2onnx_style_classifier_head_is_read_to_the_logits(tmp_path):
    """Cast, the chain, then Softmax -> ArgMax -> ArrayFeatureExtractor -> Reshape -> Cast."""
    rng = np.random.default_rng(12)
    layers = random_mlp(rng, [16, 24, 5])
    model = onnx_mlp(layers, "matmul")
    g = model.graph
    g.node[0].input[0] = "xf"
    g.node.insert(0, helper.make_node("Cast", ["x"], ["xf"], name="cast_in", to=1))
    g.node[-1].op_type = "Softmax"  # replace the final Identity
    g.node.extend([
        helper.make_node("ArgMax", ["y"], ["am"], name="argmax", axis=1),
        helper.make_node("ArrayFeatureExtractor", ["classes", "am"], ["lab"], name="afe",
                         domain="ai.onnx.ml"),
        helper.make_node("Reshape", ["lab", "shape"], ["lab2"], name="reshape"),
        helper.make_node("Cast", ["lab2"], ["label"], name="cast_out", to=7),
    ])
    g.initializer.extend([numpy_helper.from_array(np.arange(5, dtype=np.int64), "classes"),
                          numpy_helper.from_array(np.array([-1], np.int64), "shape")])
    g.output.insert(0, helper.make_tensor_value_info("label", TensorProto.INT64, [None]))
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 1))
    onnx.save(model, tmp_path / "m.onnx")
    x = rng.random((60, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["import", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "m.h5"),
                 "--inputs", str(tmp_path / "x.npy"), "--quiet"]) == 0
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    label = sess.run(["label"], {"x": x})[0]
    _, preds, stored = our_outputs(tmp_path / "m.h5")
    np.testing.assert_array_equal(preds, label)
    np.testing.assert_array_equal(stored, label)
    with Store(tmp_path / "m.h5") as st:
        assert st.provenance["source"]["head"] == "Softmax"


# -- refusals ------------------------------------------------------------------------
def _refused(tmp_path, capsys, model_path, message, extra=()):
    out = tmp_path / "refused.h5"
    status = main(["import", str(model_path), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert status == 2
    assert message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.glob(".refused.h5.tmp*"))


def test_onnx_convolution_refused(tmp_path, capsys):
    rng = np.random.default_rng(13)
    model = onnx_mlp(random_mlp(rng, [8, 8, 3]), "gemm")
    w = numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "K")
    model.graph.initializer.append(w)
    model.graph.node[0].input[0] = "c"
    model.graph.node.insert(0, helper.make_node("Conv", ["x", "K"], ["c"], name="conv1"))
    onnx.save(model, tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx", "node 'conv1' (Conv): Conv is not supported")


def test_onnx_other_activation_refused(tmp_path, capsys):
    rng = np.random.default_rng(14)
    model = onnx_mlp(random_mlp(rng, [8, 8, 3]), "gemm")
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"
    onnx.save(model, tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx", "node 'relu0' (Sigmoid): Sigmoid is not "
                                                     "supported")


def test_onnx_shape_mismatch_refused(tmp_path, capsys):
    rng = np.random.default_rng(15)
    layers = random_mlp(rng, [8, 8, 3])
    layers[1] = (np.ones((9, 3), np.float32), layers[1][1], "none")
    model = onnx_mlp(layers, "matmul")
    onnx.save(model, tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx",
             "node 'mm1' (MatMul): takes 9 inputs but layer 1 (node 'mm0' (MatMul)) has 8")


def test_onnx_nan_weight_refused(tmp_path, capsys):
    rng = np.random.default_rng(16)
    layers = random_mlp(rng, [8, 8, 3])
    layers[0][0][2, 5] = np.nan
    onnx.save(onnx_mlp(layers, "gemm"), tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx", "tensor 'W0': 1 NaN or infinite values")


def test_onnx_branch_and_garbage_refused(tmp_path, capsys):
    rng = np.random.default_rng(17)
    model = onnx_mlp(random_mlp(rng, [8, 8, 3]), "gemm")
    model.graph.node.append(helper.make_node("Relu", ["z0"], ["side"], name="side_relu"))
    onnx.save(model, tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx", "the chain branches at 'z0'")
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x01garbage" * 10)
    _refused(tmp_path, capsys, tmp_path / "junk.onnx", "not an ONNX model")


def test_safetensors_refusals(tmp_path, capsys):
    rng = np.random.default_rng(18)
    good = random_mlp(rng, [8, 6, 3])
    t = {"fc0.weight": good[0][0].T.copy(), "fc0.bias": good[0][1],
         "fc1.weight": good[1][0].T.copy(), "fc1.bias": good[1][1]}
    cases = [
        ({**t, "conv.weight": np.ones((4, 1, 3, 3), np.float32)},
         "tensor 'conv.weight': has shape (4, 1, 3, 3), expected 2 dimension(s) for an "
         "nn.Linear weight (a convolution?)"),
        ({**t, "bn.running_mean": np.zeros(6, np.float32)},
         "tensor 'bn.running_mean': is not an nn.Linear weight or bias"),
        ({**t, "fc1.weight": np.ones((3, 7), np.float32)},
         "layer 'fc1': takes 7 inputs but layer 1 (layer 'fc0') has 6 features"),
        ({**t, "fc0.bias": np.full(6, np.inf, np.float32)},
         "tensor 'fc0.bias': 6 NaN or infinite values"),
        ({**t, "fc1.bias": np.zeros(4, np.float32)},
         "tensor 'fc1.bias': has shape (4,); fc1.weight has 3 outputs"),
    ]
    for k, (tensors, message) in enumerate(cases):
        path = tmp_path / f"bad{k}.safetensors"
        safetensors_numpy.save_file(tensors, str(path))
        _refused(tmp_path, capsys, path, message)
    path = tmp_path / "good.safetensors"
    safetensors_numpy.save_file(t, str(path))
    _refused(tmp_path, capsys, path, "--layer-order names 'fc9'",
             ["--layer-order", "fc0,fc9"])
    _refused(tmp_path, capsys, path, "tensor 'fc1.weight': is not in --layer-order",
             ["--layer-order", "fc0"])


def test_bad_inputs_and_labels_refused(tmp_path, capsys):
    rng = np.random.default_rng(19)
    save_safetensors(tmp_path / "m.safetensors", random_mlp(rng, [8, 6, 3]))
    np.save(tmp_path / "x7.npy", np.zeros((5, 7), np.float32))
    np.save(tmp_path / "x.npy", np.zeros((5, 8), np.float32))
    np.save(tmp_path / "y4.npy", np.zeros(4, np.int64))
    np.save(tmp_path / "y9.npy", np.array([0, 1, 2, 9, 0]))
    m = tmp_path / "m.safetensors"
    _refused(tmp_path, capsys, m, "x7.npy: 7 features per image, the model takes 8",
             ["--inputs", str(tmp_path / "x7.npy")])
    _refused(tmp_path, capsys, m, "y4.npy: 4 labels for 5 images",
             ["--inputs", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y4.npy")])
    _refused(tmp_path, capsys, m, "y9.npy: label 9 of image 4 outside 0..2",
             ["--inputs", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y9.npy")])
    _refused(tmp_path, capsys, tmp_path / "missing.onnx", "no such model file")


def test_existing_store_needs_force(tmp_path, capsys):
    rng = np.random.default_rng(20)
    save_safetensors(tmp_path / "m.safetensors", random_mlp(rng, [8, 6, 3]))
    (tmp_path / "s.h5").write_text("keep me")
    assert main(["import", str(tmp_path / "m.safetensors"), "--out", str(tmp_path / "s.h5")]) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (tmp_path / "s.h5").read_text() == "keep me"
    assert main(["import", str(tmp_path / "m.safetensors"), "--out", str(tmp_path / "s.h5"),
                 "--force", "--quiet"]) == 0
    with Store(tmp_path / "s.h5") as st:
        assert st.readout == "argmax" and not st.has_inputs


def test_import_without_inputs_says_so_and_infer_says_how_to_add_them(tmp_path, capsys):
    """A store with no images is fine to write, but says so at once (one line on stderr)
    and names the import command with --inputs, at import and again at infer."""
    rng = np.random.default_rng(25)
    onnx.save(onnx_mlp(random_mlp(rng, [8, 6, 3])), tmp_path / "m.onnx")
    out = tmp_path / "m.h5"
    assert main(["import", str(tmp_path / "m.onnx"), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "0 images" in captured.out
    (note,) = captured.err.splitlines()
    assert f"{out} has no inputs" in note
    assert f"spdnn import {tmp_path / 'm.onnx'} --out {out} --force --inputs X.npy" in note
    assert main(["infer", str(out), "--backend", "cpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "store has no inputs" in err and "--inputs X.npy [--labels y.npy]" in err
    assert f"spdnn import {tmp_path / 'm.onnx'} --out {out} --force" in err
    assert "spdnn prepare" not in err and "--generate-inputs" not in err
    np.save(tmp_path / "x.npy", rng.random((5, 8)).astype(np.float32))
    assert main(["import", str(tmp_path / "m.onnx"), "--out", str(out), "--force",
                 "--inputs", str(tmp_path / "x.npy")]) == 0
    assert "no inputs" not in capsys.readouterr().err  # the hint worked: no note now
    assert main(["import", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "q.h5"),
                 "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")  # --quiet: nothing at all


def test_onnx_cycle_refused_without_hanging(tmp_path):
    """A Relu writing the graph's input made the chain walk loop forever, memory growing."""
    import subprocess
    import sys

    rng = np.random.default_rng(21)
    model = onnx_mlp(random_mlp(rng, [8, 8, 3]), "gemm")
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.output[0] = "x"  # z0 -> Relu -> x -> Gemm -> z0: a cycle
    onnx.save(model, tmp_path / "m.onnx")
    out = tmp_path / "m.h5"
    run = subprocess.run([sys.executable, "-m", "spdnn_mpi.cli", "import",
                          str(tmp_path / "m.onnx"), "--out", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "node 'relu0' (Relu): writes the graph's input 'x'" in run.stderr
    assert "Traceback" not in run.stderr and not out.exists()


def test_onnx_tensor_written_twice_refused(tmp_path, capsys):
    rng = np.random.default_rng(22)
    model = onnx_mlp(random_mlp(rng, [8, 8, 3]), "gemm")
    model.graph.node.append(helper.make_node("Identity", ["B1"], ["r0"], name="again"))
    onnx.save(model, tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx",
             "node 'again' (Identity): writes 'r0', which node 'relu0' (Relu) writes too")


@pytest.mark.parametrize("which", ["model", "inputs", "labels"])
def test_import_never_writes_over_its_inputs(tmp_path, capsys, which):
    rng = np.random.default_rng(23)
    save_safetensors(tmp_path / "m.safetensors", random_mlp(rng, [8, 6, 3]))
    np.save(tmp_path / "x.npy", rng.random((5, 8)).astype(np.float32))
    np.save(tmp_path / "y.npy", np.array([0, 1, 2, 1, 0]))
    target = {"model": "m.safetensors", "inputs": "x.npy", "labels": "y.npy"}[which]
    before = (tmp_path / target).read_bytes()
    assert main(["import", str(tmp_path / "m.safetensors"), "--out", str(tmp_path / target),
                 "--inputs", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--force", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path / target} is the " in err and "refusing to write over an input" in err
    assert (tmp_path / target).read_bytes() == before


def test_import_checks_its_output_before_reading_the_model(tmp_path, capsys, monkeypatch):
    from spdnn_mpi.formats.models import importer

    def never(*args, **kwargs):
        raise AssertionError("the model was read before --out was checked")

    monkeypatch.setattr(importer, "read_model", never)
    rng = np.random.default_rng(24)
    save_safetensors(tmp_path / "m.safetensors", random_mlp(rng, [8, 6, 3]))
    (tmp_path / "a-file").write_text("not a folder\n")
    assert main(["import", str(tmp_path / "m.safetensors"), "--out",
                 str(tmp_path / "a-file" / "s.h5")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_values_beyond_float32_are_one_line_without_a_warning(tmp_path, capsys):
    """float64 values that overflow float32 printed numpy's RuntimeWarning above the error."""
    import warnings

    rng = np.random.default_rng(25)
    w, b, _ = random_mlp(rng, [8, 3])[0]
    big = w.T.astype(np.float64)
    big[1, 2] = 1e39
    safetensors_numpy.save_file({"fc0.weight": big, "fc0.bias": b.astype(np.float64)},
                                str(tmp_path / "big.safetensors"))
    save_safetensors(tmp_path / "m.safetensors", [(w, b, "none")])
    np.save(tmp_path / "x.npy", np.full((2, 8), 1e39))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would be an exception here
        _refused(tmp_path, capsys, tmp_path / "big.safetensors",
                 "tensor 'fc0.weight': 1 NaN or infinite values as float32")
        _refused(tmp_path, capsys, tmp_path / "m.safetensors",
                 "x.npy: NaN or infinite value as float32 at image 1, feature 1",
                 ["--inputs", str(tmp_path / "x.npy")])


@pytest.mark.parametrize("alpha,beta,message", [
    (float("nan"), 1.0, "node 'gemm0' (Gemm): alpha=nan is not a finite number"),
    (float("inf"), 1.0, "node 'gemm0' (Gemm): alpha=inf is not a finite number"),
    (3e38, 1.0, "node 'gemm0' (Gemm): B x alpha: "),
    (1.0, float("inf"), "node 'gemm0' (Gemm): beta=inf is not a finite number"),
])
def test_gemm_scales_making_weights_not_finite_refused(tmp_path, capsys, alpha, beta, message):
    """Imported with exit 0 before, NaN or inf weights stored (alpha=nan: every reference
    prediction 0)."""
    rng = np.random.default_rng(26)
    model = onnx_mlp(random_mlp(rng, [8, 6, 3]), "gemm")
    gemm = model.graph.node[0]
    del gemm.attribute[:]
    gemm.attribute.extend([helper.make_attribute("alpha", alpha),
                           helper.make_attribute("beta", beta),
                           helper.make_attribute("transB", 1)])
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.full((6, 8), 2.0, np.float32), "W0"))
    onnx.save(model, tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx", message)


def test_layer_without_outputs_refused(tmp_path, capsys):
    """A 16 x 0 weight imported, then `infer` said `n_out is 0`."""
    safetensors_numpy.save_file({"fc0.weight": np.zeros((0, 16), np.float32),
                                 "fc0.bias": np.zeros(0, np.float32)},
                                str(tmp_path / "m.safetensors"))
    _refused(tmp_path, capsys, tmp_path / "m.safetensors",
             "layer 'fc0': has 16 inputs and 0 outputs; a layer needs at least one of each")
    model = onnx_mlp([(np.zeros((16, 0), np.float32), np.zeros(0, np.float32), "none")],
                     "matmul")
    onnx.save(model, tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx",
             "node 'mm0' (MatMul): has 16 inputs and 0 outputs")


def _header_only_safetensors(path, header):
    import json
    import struct

    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(64))
    return path


@pytest.mark.parametrize("header,message", [
    ({"fc0.weight": [1, 2]}, "tensor 'fc0.weight': header entry is not an object"),
    ({"fc0.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": ["0", "16"]},
      "fc0.bias": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}},
     "tensor 'fc0.weight': data_offsets ['0', '16'] is not two integers"),
    ({"fc0.weight": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}},
     "tensor 'fc0.weight': shape 4 is not a list of sizes"),
])
def test_malformed_safetensors_headers_are_one_line(tmp_path, capsys, header, message):
    path = _header_only_safetensors(tmp_path / "m.safetensors", header)
    _refused(tmp_path, capsys, path, message)


def test_npz_inputs_are_one_line(tmp_path, capsys):
    rng = np.random.default_rng(27)
    save_safetensors(tmp_path / "m.safetensors", random_mlp(rng, [8, 3]))
    np.savez(tmp_path / "x.npz", x=np.ones((2, 8), np.float32))
    _refused(tmp_path, capsys, tmp_path / "m.safetensors",
             "x.npz: a .npz archive, not one array: save the inputs with numpy.save (.npy)",
             ["--inputs", str(tmp_path / "x.npz")])


def test_sparse_initializer_index_out_of_range_is_one_line(tmp_path, capsys):
    rng = np.random.default_rng(28)
    model = onnx_mlp(random_mlp(rng, [4, 3]), "gemm")
    dense = model.graph.initializer[0]
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0, 2.0], np.float32), dense.name),
        numpy_helper.from_array(np.array([0, 100], np.int64), dense.name + "_ids"), [3, 4])
    model.graph.initializer.remove(dense)
    model.graph.sparse_initializer.append(sparse)
    onnx.save(model, tmp_path / "m.onnx")
    _refused(tmp_path, capsys, tmp_path / "m.onnx",
             "sparse initializer 'W0': index 100 outside the 12 values of shape (3, 4)")


@pytest.mark.parametrize("location,message", [
    ("w.bin", "external weights of tensor 'W0' not readable"),
    ("../outside.bin", "external weights of tensor 'W0' not readable"),
])
def test_bad_external_data_is_one_line(tmp_path, capsys, location, message):
    from onnx.external_data_helper import convert_model_to_external_data

    rng = np.random.default_rng(29)
    model = onnx_mlp(random_mlp(rng, [4, 3]), "gemm")
    sub = tmp_path / "model"
    sub.mkdir()
    convert_model_to_external_data(model, location="w.bin", size_threshold=0)
    onnx.save(model, sub / "m.onnx")
    (sub / "w.bin").unlink()  # missing
    model = onnx.load(sub / "m.onnx", load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    (sub / "m.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "outside.bin").write_bytes(bytes(64))
    _refused(tmp_path, capsys, sub / "m.onnx", message)
