"""Run inference on a store; the same command under mpiexec/mpirun/srun.

Rank 0 checks (--check), writes the results and the report, and prints the summary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

EXAMPLES = """\
examples:
  spdnn infer store.h5 --check
  spdnn infer store.h5 --layers 120 --backend cpu --out cats.tsv --json report.json
  mpiexec -n 4 spdnn infer store.h5 --backend cuda --check --json report.json
  spdnn infer model.h5 --check --out classes.tsv   # an argmax store from `spdnn import`

The text report gives the figure of merit (edges/s over the slowest rank), load
and layout time, live rows after a few layers, the categories (argmax stores:
predictions and accuracy), peak host memory and the machine;
with several ranks also each rank's time (or min/median/max beyond 8 ranks).
The JSON report has every layer's live rows and every rank's details.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spdnn_mpi.commands.options import add_backend, add_json, add_quiet

    p.add_argument("store", help="HDF5 store made by `spdnn generate` or `spdnn prepare`")
    p.add_argument("--layers", type=int, default=None, metavar="L",
                   help="number of layers to run (default: all layers in the store)")
    add_backend(p)
    p.add_argument("--check", action="store_true",
                   help="compare with the store's truth (argmax stores: its reference "
                        "predictions); exit 1 on any difference")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="write the categories here (official TSV format; argmax stores: "
                        "image_id<TAB>class lines), replacing FILE (a results file); "
                        "'-' writes them to standard output, and the summary then goes "
                        "to standard error")
    add_json(p, "the run report")
    p.add_argument("--batch", type=int, default=None, metavar="ROWS",
                   help="images per batch on each rank (default: as many as fit in memory)")
    p.add_argument("--partition", default="count", choices=["count", "nnz"],
                   help="split images across ranks by count or by input nonzeros")
    p.add_argument("--threads", type=int, default=None, metavar="COUNT",
                   help="CPU threads per rank (default: usable cores / ranks on the node)")
    p.add_argument("--oversubscribe-gpus", action="store_true",
                   help="allow several ranks per GPU (for testing)")
    p.add_argument("--weights-load", default="node", choices=["node", "rank"],
                   help="node: one rank per node reads the weights and shares them; "
                        "rank: every rank reads the store itself")
    p.add_argument("--compress", default="auto", choices=["auto", "off"],
                   help="auto: compute each group of bit-identical live rows once (exact: "
                        "same categories and features); off: compute every live row")
    add_quiet(p)


def progress_printer(n_ranks: int):
    """The engine's progress callback for rank 0 (its own rows when there are several ranks)."""
    from spdnn_mpi.util.progress import Progress, stderr_lines

    emit = stderr_lines("spdnn infer")

    whose = " on rank 0" if n_ranks > 1 else ""
    state: dict = {}

    def show(done: int, total: int, live: int, seconds: float) -> None:
        bar = state.get(total)
        if bar is None:  # the engine limits the rate; print every call it makes
            bar = state[total] = Progress("inference", total, emit, every=0.0)
        bar(done, f"live rows{whose} {live}", elapsed=seconds)

    return show


def sample_layers(n_layers: int) -> list[int]:
    """A few layer counts to show live rows at: 1, 2, 4, 8, ... and the last."""
    out, k = [], 1
    while k < n_layers:
        out.append(k)
        k *= 2
    return out + [n_layers] if n_layers >= 1 else []


def rank_line(per_rank: list[dict]) -> str:
    """Each rank's inference time (up to 8 ranks), else min / median / max and the slowest."""
    times = [r["inference_seconds"] for r in per_rank]
    hosts = len({r["host"] for r in per_rank})
    if len(per_rank) <= 8:
        body = ", ".join(f"{r['rank']}: {r['inference_seconds']:.4f} s ({r['images']} images)"
                         for r in per_rank)
    else:
        slowest = max(per_rank, key=lambda r: r["inference_seconds"])
        body = (f"min {min(times):.4f} s, median {statistics.median(times):.4f} s, "
                f"max {max(times):.4f} s (rank {slowest['rank']})")
    return f"per rank    {body}; {hosts} host(s)"


def machine_line(report: dict) -> str:
    m = report.get("machine", {})
    device = ""
    backends = [r.get("backend", {}) for r in report.get("per_rank", [])]
    devices = sorted({b["device"] for b in backends if isinstance(b, dict) and b.get("device")})
    if devices:
        device = f", {', '.join(devices)}"
    threads = [b.get("threads") for b in backends if isinstance(b, dict) and b.get("threads")]
    thread_note = f", {threads[0]} thread(s) per rank" if threads else ""
    return (f"machine     {m.get('hostname', '?')}: {m.get('cpu', '?')}, "
            f"{m.get('cpu_count', '?')} cores{thread_note}{device}, Python {m.get('python', '?')}")


def compile_words(report: dict) -> str:
    """What the kernels cost this run: compiled (and how long), or loaded from a cache."""
    if report.get("kernels_compiled"):
        return f"kernels compiled {report['compile_seconds']:.3f} s, "
    if report["backend"] in ("cuda", "cpu"):  # the reference backend has no kernels
        return f"kernels from the cache {report['compile_seconds']:.3f} s, "
    return ""


def format_rate(edges_per_second: float) -> str:
    """Edges/s in the unit that shows three digits: TeraEdges/s for the challenge's
    networks, GigaEdges/s or MegaEdges/s for small classifiers (not '0.000 TeraEdges/s')."""
    for scale, unit in ((1e12, "TeraEdges/s"), (1e9, "GigaEdges/s"), (1e6, "MegaEdges/s")):
        if edges_per_second >= scale:
            return f"{edges_per_second / scale:.3f} {unit}"
    return f"{edges_per_second:.0f} edges/s"


def network_line(report: dict) -> str:
    """The network's shape: N neurons x L layers where every level is N wide, else the
    widths of every level (784-1024-1024-10)."""
    widths = report.get("layer_widths") or [report["neurons"]]
    if len(set(widths)) == 1:
        shape = f"{widths[0]} neurons x {report['n_layers']} layers"
    else:
        shape = f"{'-'.join(map(str, widths))} ({report['n_layers']} layers)"
    return f"network     {shape}, {report['n_images']} images"


def summary_lines(report: dict) -> list[str]:
    """The human summary printed by rank 0."""
    from spdnn_mpi.util.memory import format_bytes

    live = report.get("live_rows_per_layer") or []
    inputs = "inputs to the GPU" if report["backend"] == "cuda" else "inputs laid out"
    lines = [
        network_line(report),
        f"backend     {report['backend']} ({report['backend_choice']}), {report['ranks']} rank(s)",
        f"set-up      read {report['load_seconds']:.3f} s (of which "
        f"{report['validate_seconds']:.3f} s validation), layout "
        f"{report['layout_seconds']:.3f} s, {compile_words(report)}warm-up "
        f"{report['warm_up_seconds']:.3f} s, {inputs} {report['input_seconds']:.3f} s",
        f"inference   {report['inference_seconds']:.4f} s (slowest rank), "
        f"imbalance {report['imbalance']:.3f}",
    ]
    if report["ranks"] > 1 and report.get("per_rank"):
        lines.append(rank_line(report["per_rank"]))
    lines += [
        f"rate        {format_rate(report['edges_per_second'])} nominal "
        f"(challenge: all images x all edges / time), "
        f"{format_rate(report['computed_edges_per_second'])} computed (edges multiplied)",
        compression_line(report),
    ]
    if live:
        shown = ", ".join(f"{k}: {live[k - 1]}" for k in sample_layers(len(live)))
        if report.get("compress", "off") == "off":
            lines.append(f"live rows   after layer {shown}")
        else:  # with compression the backend computes representative rows only
            lines.append(f"rows        computed (representatives) after layer {shown}")
    if report.get("readout") == "argmax":
        lines.append(f"predictions one class per image for {report['n_images']} images")
        if "accuracy" in report:
            acc = report["accuracy"]
            lines.append(f"accuracy    {100 * acc['accuracy']:.2f}% ({acc['correct']} of "
                         f"{acc['images']}) against the stored labels")
    else:
        lines.append(f"categories  {report['categories_count']} images alive after layer "
                     f"{report['n_layers']}")
    if "end_to_end_seconds" in report:
        runtimes = {"cuda": "finding the GPU (CuPy, the driver)", "cpu": "importing numba"}
        runtime = (f"{report['device_seconds']:.3f} s {runtimes[report['backend']]}, "
                   if report["backend"] in runtimes else "")
        lines.append(f"answer      {report['write_seconds']:.3f} s writing the results; "
                     f"{report['end_to_end_seconds']:.3f} s since the process started: "
                     f"{report['startup_seconds']:.3f} s before the command ran, {runtime}"
                     f"{report['other_seconds']:.3f} s in no phase above")
    if "peak_host_bytes" in report:
        lines.append(f"memory      peak host {format_bytes(report['peak_host_bytes'])} "
                     f"({'largest rank' if report['ranks'] > 1 else 'this process'})")
    if report.get("machine"):
        lines.append(machine_line(report))
    check = report.get("check")
    if check is not None and "differ_count" in check:
        if check["passed"]:
            lines.append(f"check       PASSED ({check['expected_count']} predictions match "
                         "the stored reference)")
        else:
            lines.append(f"check       FAILED: {check['differ_count']} of "
                         f"{check['expected_count']} predictions differ "
                         f"(first image ids {check['differ_first']})")
    elif check is not None:
        if check["passed"]:
            lines.append(f"check       PASSED ({check['expected_count']} categories match)")
        else:
            lines.append(
                f"check       FAILED: {check['missing_count']} missing "
                f"(first {check['missing_first']}), {check['extra_count']} extra "
                f"(first {check['extra_first']})"
            )
    return lines


def compression_line(report: dict) -> str:
    """What compression did: the first merge and where the rows ended up."""
    events = report.get("compression") or []
    if report.get("compress") == "off":
        return "compress    off (every live row computed)"
    merged = [e for e in events if e["representatives"] < e["rows"]]
    if not merged:
        return f"compress    auto: {len(events)} check(s), no identical rows found"
    first, last = merged[0], events[-1]
    return (f"compress    auto: {len(events)} check(s); after layer {first['layer']} "
            f"{first['rows']} rows -> {first['representatives']} representatives; "
            f"from layer {last['layer']} {last['images']} images as "
            f"{last['representatives']} representative row(s)")


def run(args: argparse.Namespace) -> int:
    from spdnn_mpi import comm as mpi
    from spdnn_mpi.commands.options import STDOUT, json_file
    from spdnn_mpi.driver import RunOptions, distributed_infer
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.tsv.write import categories_text
    from spdnn_mpi.readout import compare_categories
    from spdnn_mpi.report import process_seconds
    from spdnn_mpi.util.progress import stderr_lines

    startup_seconds = process_seconds()  # Python, the imports, MPI's initialisation
    if args.out == STDOUT and args.json == STDOUT:
        raise SpdnnError("--out - and --json - both ask for standard output; "
                         "send one of them to a file")
    world = mpi.world()
    rank = world.Get_rank()
    emit = None if args.quiet or rank != 0 else stderr_lines("spdnn infer")
    opts = RunOptions(
        store=args.store, layers=args.layers, backend=args.backend, partition=args.partition,
        batch=args.batch, threads=args.threads, oversubscribe_gpus=args.oversubscribe_gpus,
        weights_load=args.weights_load, compress=args.compress,
        progress=None if args.quiet else progress_printer(world.Get_size()),
        check=args.check, out=None if args.out == STDOUT else args.out,
        json=json_file(args), emit=emit,
    )
    if rank == 0 and not args.quiet:
        print(f"spdnn infer: {args.store} on {world.Get_size()} rank(s)", file=sys.stderr)
    report = distributed_infer(world, opts)
    if report is not None:
        report.startup_seconds = startup_seconds

    def finish() -> int:
        if rank != 0:
            return 0
        if report.predictions is not None:
            return finish_argmax(args, report)
        status = 0
        if args.check:  # against the truth read when the run started
            report.check = compare_categories(report.categories, np.asarray(report.truth))
            status = 0 if report.check["passed"] else 1
        t0 = time.perf_counter()
        if args.out:
            write_results(args.out, categories_text(report.categories))
        write_report(args, report, time.perf_counter() - t0)
        return status

    if world.Get_size() == 1:
        return finish()
    return int(world.bcast(mpi.run_phase(world, finish), root=0))


def finish_argmax(args: argparse.Namespace, report) -> int:
    """Rank 0 on an argmax store: check, score, write the predictions and the report
    (the reference predictions and labels were read when the run started)."""
    from spdnn_mpi.formats.tsv.write import predictions_text
    from spdnn_mpi.readout import accuracy, compare_predictions

    status = 0
    predictions, labels = report.predictions, report.labels
    if args.check:
        report.check = compare_predictions(predictions, report.reference)
        status = 0 if report.check["passed"] else 1
    if labels is not None:
        report.accuracy = {"accuracy": accuracy(predictions, labels),
                           "correct": int(np.count_nonzero(predictions == labels)),
                           "images": int(len(labels))}
    t0 = time.perf_counter()
    if args.out:
        write_results(args.out, predictions_text(predictions))
    write_report(args, report, time.perf_counter() - t0)
    return status


def write_results(out: str, text: bytes) -> None:
    """The results' lines to ``--out``: a file written atomically (gzip for .gz), or
    standard output for '-'."""
    from spdnn_mpi.commands.options import STDOUT
    from spdnn_mpi.formats.tsv.write import write_text

    if out == STDOUT:
        sys.stdout.write(text.decode())
        sys.stdout.flush()
    else:
        write_text(out, text)


def write_report(args: argparse.Namespace, report, write_seconds: float) -> None:
    """The JSON report (with the time the results took to write and since the process
    started) and the printed summary."""
    from spdnn_mpi.commands.options import emit_json, text_stream
    from spdnn_mpi.report import process_seconds

    summary = report.to_json()
    summary["write_seconds"] = write_seconds
    summary["end_to_end_seconds"] = process_seconds()
    timed = ("startup_seconds", "load_seconds", "device_seconds", "layout_seconds",
             "compile_seconds", "warm_up_seconds", "input_seconds", "inference_seconds",
             "write_seconds")
    summary["other_seconds"] = max(0.0, summary["end_to_end_seconds"]
                                   - sum(summary.get(k) or 0.0 for k in timed))
    emit_json(args, summary)
    print("\n".join(summary_lines(summary)), file=text_stream(args))
