"""The part of `spdnn bench` for imported models (stores with the argmax readout): our
time, accuracy and check per model, then each model peer on the same inputs and
batch (it agrees when its predictions equal ours on every image).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spdnn_mpi.model import SparseRows

#: Model peers: name -> (module, function) returning (outputs, median s, all s).
MODEL_PEERS = {
    "onnxruntime": ("spdnn_mpi.bench.peers.onnx_dense", "onnxruntime_infer"),
    "torch-dense": ("spdnn_mpi.bench.peers.torch_models", "torch_dense_infer"),
    "torch": ("spdnn_mpi.bench.peers.torch_models", "torch_sparse_mlp_infer"),
}
#: What each model peer runs, in words, for the plot's legend.
PEER_LABELS = {
    "onnxruntime": "onnxruntime (dense, CPU)",
    "torch-dense": "PyTorch dense (cuBLAS)",
    "torch": "torch.sparse (CSR)",
}


def is_model_store(path: Path) -> bool:
    """Whether the store at ``path`` holds an imported model (the argmax readout)."""
    from spdnn_mpi.formats.store.reader import Store

    with Store(path) as store:
        return store.readout == "argmax"


def shipped_model_stores(args) -> list[Path]:
    """Stores of the shipped models asked for with --model/--models, imported once."""
    from spdnn_mpi.generators import mnist_models as mm
    from spdnn_mpi.util.paths import cache_dir

    if args.models:
        entries = [e for e in mm.bundled_models() if e.get("file")]
    else:
        entries = [mm.find_model(s) for s in args.model]
    directory = (args.data_dir or cache_dir()) / "models"
    return [mm.model_store(e, directory) for e in entries]


def tile_rows(rows: SparseRows, n: int) -> SparseRows:
    """The first ``n`` rows of ``rows`` repeated as often as needed (for longer timing runs)."""
    if n <= rows.n_rows:
        return rows.slice(0, n)
    reps = -(-n // rows.n_rows)
    counts = np.tile(np.diff(rows.indptr), reps)[:n]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    nnz = int(indptr[-1])
    indices = np.tile(rows.indices, reps)[:nnz]
    values = None if rows.values is None else np.tile(rows.values, reps)[:nnz]
    return SparseRows(rows.n_cols, indptr, indices, values)


def _outputs(result, n_rows: int, width: int) -> np.ndarray:
    out = np.zeros((n_rows, width), np.float32)
    out[result.alive_ids] = result.features
    return out


def _score(classes: np.ndarray, labels: np.ndarray | None) -> float | None:
    if labels is None:
        return None
    n = min(len(labels), len(classes))
    return float(np.mean(classes[:n] == labels[:n]))


def bench_model(args, store_path: Path, backend, backend_name: str) -> dict:
    """One model: our time, accuracy and check, then every asked-for model peer."""
    import importlib

    from spdnn_mpi.engine import run_inference, time_inference
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.models.mlp import sparsity
    from spdnn_mpi.formats.store.reader import Store
    from spdnn_mpi.readout import compare_predictions

    with Store(store_path) as store:
        network = store.network()
        base = store.inputs()
        labels = store.labels()
        reference = store.predictions(store.n_layers)
    rows = tile_rows(base, args.model_images or base.n_rows)
    if labels is not None:
        labels = np.resize(labels, rows.n_rows)
    width = network.layers[-1].n_out
    backend.load_network(network.layers)
    run_inference(network, rows, backend, batch=args.batch)  # buffers of this batch size
    median, times, res = time_inference(network, rows, backend, args.repeat, args.batch,
                                        want_features=True)
    ours = _outputs(res, rows.n_rows, width)
    classes = np.argmax(ours, axis=1)
    row = {
        "store": str(store_path), "model": Path(network.provenance.get("source", {}).get(
            "model", store_path.name)).name,
        "sparsity": sparsity(network), "edges": network.edges(),
        "dense_weights": sum(lay.n_in * lay.n_out for lay in network.layers),
        "widths": [network.n_inputs] + [lay.n_out for lay in network.layers],
        "images": rows.n_rows, "backend": backend_name, "seconds": median,
        "seconds_all": times, "accuracy": _score(classes, labels),
        "layer_seconds": None if res.layer_seconds is None else res.layer_seconds.tolist(),
        "backend_info": backend.describe(), "peers": {},
    }
    if reference is not None:
        n = min(len(reference), rows.n_rows)
        row["check"] = {"against": "stored reference predictions",
                        **compare_predictions(classes[:n], reference[:n])}
    for peer in args.peer:
        if peer not in MODEL_PEERS:
            row["peers"][peer] = {"skipped": "not a model peer (onnxruntime, torch-dense, "
                                             "torch)"}
            continue
        module, func = MODEL_PEERS[peer]
        fn = getattr(importlib.import_module(module), func)
        kwargs = {"batch": args.batch, "repeat": args.repeat}
        if peer == "onnxruntime":
            kwargs["threads"] = args.threads
        try:
            theirs, seconds, all_s = fn(network, rows, **kwargs)
        except SpdnnError as exc:
            row["peers"][peer] = {"skipped": str(exc)}
            continue
        their_classes = np.argmax(theirs, axis=1)
        agree = compare_predictions(classes, their_classes)
        scale = max(float(np.abs(theirs).max()), 1e-30) if theirs.size else 1.0
        row["peers"][peer] = {
            "seconds": seconds, "seconds_all": all_s, "speedup": seconds / median,
            "accuracy": _score(their_classes, labels), "agrees": agree["passed"],
            "differ_count": agree["differ_count"],
            "max_rel_diff": float(np.abs(ours - theirs).max() / scale) if theirs.size else 0.0,
        }
    return row


def _runs_ms(seconds: list[float] | None) -> str | None:
    """``1.204-1.330``: fastest-slowest of timed runs, in ms (None without runs)."""
    if not seconds:
        return None
    return f"{1e3 * min(seconds):.3f}-{1e3 * max(seconds):.3f}"


def table(rows: list[dict], peers: list[str]) -> str:
    """One line per model: our median and its range, accuracy, check, each peer's time."""
    from spdnn_mpi.report import format_table

    headers = ["sparsity%", "weights", "images", "backend", "time_ms", "runs_ms", "acc%",
               "check"]
    for peer in peers:
        headers += [f"{peer}_ms", f"{peer}_runs_ms", f"x{peer}"]
    out = []
    for r in rows:
        check = r.get("check")
        line = [100 * r["sparsity"], r["edges"], r["images"], r["backend"],
                1e3 * r["seconds"], _runs_ms(r.get("seconds_all")),
                None if r["accuracy"] is None else 100 * r["accuracy"],
                "-" if check is None else ("pass" if check["passed"] else "FAIL")]
        for peer in peers:
            pr = r["peers"].get(peer, {})
            line += [1e3 * pr["seconds"] if "seconds" in pr else None,
                     _runs_ms(pr.get("seconds_all")), pr.get("speedup")]
            if pr and pr.get("agrees") is False:
                line[-1] = "DISAGREE"
        out.append(line)
    legend = ("time_ms, <peer>_ms: median of --repeat timed runs; runs_ms, <peer>_runs_ms: "
              "their fastest-slowest; x<peer>: the peer's median over ours; acc%: held-out "
              "accuracy; check: our predictions against the store's reference.")
    return format_table(headers, out) + "\n" + legend


def failed(rows: list[dict]) -> bool:
    """Any model whose check failed or whose peers predict differently."""
    return any((r.get("check") and not r["check"]["passed"])
               or any(p.get("agrees") is False for p in r["peers"].values()) for r in rows)


def speedup_series(rows: list[dict]) -> list[tuple[str, list[tuple[float, float]]]]:
    """(legend label from ``PEER_LABELS``, [(sparsity %, our speed-up over the peer)]) per
    peer that ran."""
    rows = sorted(rows, key=lambda r: r["sparsity"])
    peers = sorted({p for r in rows for p, v in r["peers"].items() if "speedup" in v})
    return [(f"over {PEER_LABELS.get(peer, peer)}",
             [(100 * r["sparsity"], r["peers"][peer]["speedup"]) for r in rows
              if "speedup" in r["peers"].get(peer, {})]) for peer in peers]


def plot(rows: list[dict], path: str | Path) -> None:
    """Speed-up over each peer and accuracy against sparsity, one PNG, written atomically."""
    from spdnn_mpi.bench.plot import pyplot
    from spdnn_mpi.util.atomic import atomic_path

    plt = pyplot()
    rows = sorted(rows, key=lambda r: r["sparsity"])
    x = [100 * r["sparsity"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, pts in speedup_series(rows):
        ax1.plot(*zip(*pts), marker="o", label=label)
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_xlabel("weight sparsity (%)")
    ax1.set_ylabel(f"speed-up of spdnn ({rows[0]['backend'] if rows else ''})")
    ax1.set_yscale("log")
    ax1.legend()
    acc = [(xi, 100 * r["accuracy"]) for xi, r in zip(x, rows) if r["accuracy"] is not None]
    if acc:
        ax2.plot(*zip(*acc), marker="o")
    ax2.set_xlabel("weight sparsity (%)")
    ax2.set_ylabel("held-out accuracy (%)")
    fig.suptitle(f"{rows[0]['images'] if rows else 0} images per run, same batch for all")
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
