"""Official Graph Challenge TSV files into a store: one network (``prepare_store``) or a tree.

Reads a ``neuron{N}`` folder layer by layer (never the whole network), plus
optionally the ``sparse-images-{N}.tsv`` inputs and ``neuron{N}-l{L}-
categories.tsv`` truth files, and writes one store atomically: on any error
nothing is left under the output name. ``spdnn prepare`` (``--weights``
for one network, ``--tree`` for ``convert_tree``) is the command-line face of
this module. Inputs made rather than read (``--generate-inputs``) come in as a
function from the command: formats never import the generators.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spdnn_mpi.model import SparseRows

import numpy as np

DEFAULT_CLIP = 32.0


def _log(enabled: bool, message: str) -> None:
    if enabled:
        print(f"spdnn prepare: {message}", file=sys.stderr, flush=True)


def prepare_store(
    weights: str | os.PathLike,
    out: str | os.PathLike,
    *,
    neurons: int | None = None,
    n_layers: int | None = None,
    inputs: str | os.PathLike | None = None,
    n_images: int | None = None,
    categories: Mapping[int, str | os.PathLike] | None = None,
    bias: float | None = None,
    clip: float | None = DEFAULT_CLIP,
    force: bool = False,
    progress: bool = True,
    make_inputs: Callable[[int], SparseRows] | None = None,
    made_inputs_source: str = "generated",
    truth_layers: list[int] | None = None,
    truth_backend: str = "reference",
    jobs: int = 1,
) -> Path:
    """Convert one network (a ``neuron{N}`` folder or its archive) into a store at ``out``.

    ``weights`` is the folder of ``n{N}-l{k}.tsv[.gz]`` files or the official
    archive ``neuron{N}.tar.gz``, streamed member by member, never unpacked.
    ``make_inputs(N)`` makes the input rows where there is no images file
    (``--generate-inputs``); ``made_inputs_source`` says in the store's
    provenance what made them. ``jobs`` worker processes parse the layer
    files while this process writes them, in order (1: all here).

    Everything cheap is checked before the long part starts (every layer file
    of a folder exists, truth files parse); memory stays at about 2 x jobs
    layers plus the inputs. Returns the store's path. Errors raise
    SpdnnError/InputFormatError and leave no file under ``out``.
    """
    from spdnn_mpi.util.workers import Background, can_fork

    weights = Path(weights)
    out = Path(out)
    _check_numbers(bias, clip, n_images)
    if jobs < 1:
        from spdnn_mpi.errors import SpdnnError

        raise SpdnnError(f"--jobs {jobs}: must be at least 1")
    # with more than one core, a worker makes the inputs while this process imports
    # numba and loads the parser's kernels (which the layer workers then start with);
    # it starts (fork) before those imports, which its copy of this process then lacks
    made = Background(make_inputs) if make_inputs is not None and jobs > 1 and can_fork() \
        else None
    with made or contextlib.nullcontext():
        from spdnn_mpi.formats.tsv.layers import LayerReader, open_layers, warm_kernels
        from spdnn_mpi.model import challenge_bias
        from spdnn_mpi.util.outputs import check_outputs
        from spdnn_mpi.util.progress import Progress, note_if_slow, stderr_lines

        check_outputs({"--out": out}, force=force, regular=True)
        source = open_layers(weights, neurons, n_layers)
        neurons, n_layers = source.neurons, source.n_layers  # n_layers None: all in an archive
        bias = challenge_bias(neurons) if bias is None else float(bias)
        categories = dict(categories or {})
        sources = source.sources(out)
        sources |= {f"the truth file given for {n} layers": p for n, p in categories.items()}
        sources["the --inputs file"] = inputs
        check_outputs({"--out": out}, sources, force=force, regular=True)
        truth_layers = sorted(set(truth_layers or []))
        _check_truth_options(categories, truth_layers, inputs, make_inputs is not None,
                             truth_backend)
        if n_layers is not None:
            _check_layer_counts(n_layers, categories, truth_layers)

        t0 = time.perf_counter()
        truth, rows = _read_inputs(inputs, n_images, categories, neurons, progress, t0)
        if made is not None:
            made.submit(neurons)
        jobs = source.useful_jobs(jobs)
        with note_if_slow(stderr_lines("spdnn prepare") if progress else None,
                          "compiling the TSV parser's kernels (once: later runs load them "
                          "from numba's cache)"):
            warm_kernels()  # here, not in the first layer's time nor each worker's
        if make_inputs is not None:
            rows = made.result() if made is not None else make_inputs(neurons)
            _log(progress, f"generated inputs: {rows.n_rows} images, {rows.nnz} nonzeros")
        if truth_layers:  # before the layers are read, not after
            from spdnn_mpi.truth import check_truth_memory, kept_layer_bytes, resolve_truth_backend

            name, fn = resolve_truth_backend(truth_backend)
            check_truth_memory(name, fn, rows.n_rows, neurons,
                               extra=max(truth_layers) * kept_layer_bytes(neurons))
        provenance = _provenance(weights, source, neurons, bias, clip, inputs, categories,
                                 made_inputs_source if make_inputs is not None else None,
                                 rows.n_rows if rows is not None else n_images)
        count = n_layers if n_layers is not None else "all"
        how = "parse threads" if getattr(source, "in_memory", False) else "worker processes"
        _log(progress, f"{count} layers of N={neurons} from {weights} -> {out}"
                       + (f" ({jobs} {how})" if jobs > 1 else ""))
        kept = []
        # the workers start (fork) before the store is opened (and h5py imported: 0.04 s
        # they need not wait for), and stop after it is closed
        with LayerReader(source, bias=bias, clip=clip, jobs=jobs, near=out) as reader, \
                _open_store(out, provenance) as writer:
            if rows is not None:
                writer.write_inputs(rows)
                if not truth_layers:
                    rows = None  # free before the layers
            for n_l, ids in sorted(truth.items()):
                writer.add_truth(n_l, ids,
                                 f"categories file given to prepare: {Path(categories[n_l]).name}")
            bar = Progress("", n_layers, stderr_lines("spdnn prepare") if progress else None,
                           every=1.0)
            edges = k = 0
            for k, layer in enumerate(reader, start=1):
                writer.add_layer(layer)
                edges += layer.nnz
                rate = f"{edges / max(time.perf_counter() - bar.start, 1e-9) / 1e6:.1f} M edges/s"
                read = source.fraction()  # an archive: the share read (layers come in any order)
                if read is None:
                    bar(k, rate)
                else:  # the time left follows the archive read, until the last layer is written
                    done = min(max(read, k / n_layers if n_layers else 0.0), 0.99)
                    bar(k, f"{read:.0%} of the archive read, {rate}", fraction=done)
                if truth_layers:
                    kept.append(layer)
            if n_layers is None:  # an archive read to its end
                n_layers = bar.total = k
                _check_layer_counts(n_layers, categories, truth_layers)
                bar(k, f"{edges / max(time.perf_counter() - bar.start, 1e-9) / 1e6:.1f} M edges/s")
            provenance["layers"] = n_layers
            provenance["source"]["layer_files"] = source.describe()
            writer.set_provenance(provenance)
            if truth_layers:
                _add_computed_truth(writer, kept, rows, truth_layers, truth_backend, progress)
        _log(
            progress,
            f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s",
        )
        return out


def _open_store(out: Path, provenance: dict):
    """A StoreWriter of ``out``, h5py imported here."""
    from spdnn_mpi.formats.store.writer import StoreWriter

    return StoreWriter(out, provenance)


def _check_truth_options(categories: dict, truth_layers: list[int], inputs,
                         generate_inputs: bool, truth_backend: str) -> None:
    """Refuse truth options that contradict each other (before anything long is read)."""
    from spdnn_mpi.errors import SpdnnError

    if generate_inputs and inputs is not None:
        raise SpdnnError("give either --inputs FILE or --generate-inputs, not both")
    if generate_inputs and categories:
        files = ", ".join(str(v) for _, v in sorted(categories.items()))
        raise SpdnnError(
            f"--categories {files}: truth files belong to the official inputs, and "
            "--generate-inputs makes different images, so that truth would not match; "
            "compute truth for the generated inputs with --truth-layers L instead"
        )
    if truth_layers and inputs is None and not generate_inputs:
        raise SpdnnError("--truth-layers needs inputs: --inputs FILE or --generate-inputs")
    both = sorted(set(truth_layers) & set(categories))
    if both:
        raise SpdnnError(f"--truth-layers {both[0]}: truth for {both[0]} layers is given by "
                         f"--categories {categories[both[0]]}; leave one of them out")
    if truth_layers and truth_backend == "none":
        raise SpdnnError("--truth-backend none computes no truth; drop --truth-layers or "
                         "choose reference or cpu")


def _check_layer_counts(n_layers: int, categories: dict, truth_layers: list[int]) -> None:
    """Truth files and --truth-layers for layer counts the store gets (an archive: once read)."""
    from spdnn_mpi.errors import SpdnnError

    for n_l in categories:
        if not 1 <= n_l <= n_layers:
            raise SpdnnError(
                f"truth {categories[n_l]} is for {n_l} layers but the store gets {n_layers}; "
                f"use --layers {n_l} (or more) or leave that file out"
            )
    bad = [t for t in truth_layers if not 1 <= t <= n_layers]
    if bad:
        raise SpdnnError(f"--truth-layers {bad} outside 1..{n_layers}")


def _read_inputs(inputs, n_images, categories: dict, neurons: int, progress: bool,
                 t0: float) -> tuple[dict, SparseRows | None]:
    """(truth ids by layer count from the categories files, the --inputs rows or None)."""
    if not categories and inputs is None:
        return {}, None  # the parser (numba) not imported yet: see prepare_store
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.tsv import read as tsv

    truth = {n_l: tsv.read_categories(path, n_images) for n_l, path in sorted(categories.items())}
    if inputs is None:
        return truth, None
    _log(progress, f"reading inputs {inputs}")
    rows = tsv.read_images(inputs, neurons, n_images)
    for n_l, ids in truth.items():
        if len(ids) and ids[-1] > rows.n_rows:
            raise SpdnnError(f"{categories[n_l]}: image id {int(ids[-1])} beyond the "
                             f"{rows.n_rows} images of the inputs (pass --images)")
    _log(progress, f"inputs: {rows.n_rows} images, {rows.nnz} nonzeros "
                   f"({time.perf_counter() - t0:.1f} s)")
    return truth, rows


def _provenance(weights: Path, source, neurons: int, bias: float, clip: float | None, inputs,
                categories: dict, made_inputs: str | None, images: int | None) -> dict:
    """The store's record of where it came from (layer count and files filled in at the end)."""
    from spdnn_mpi import __version__

    folder = hasattr(source, "files")
    return {
        "tool": "spdnn prepare",
        "spdnn_mpi_version": __version__,
        "prepared": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "source": {
            "format": "graphchallenge-tsv",
            ("weights_dir" if folder else "weights_archive"): str(weights.resolve()),
            "layer_files": source.describe() if folder else None,
            "inputs": str(Path(inputs).resolve()) if inputs is not None else made_inputs,
            "categories": {str(k): str(Path(v).resolve()) for k, v in sorted(categories.items())},
        },
        "neurons": neurons,
        "layers": source.n_layers,
        "bias": bias,
        "clip": clip,
        "images": images,
    }


def _check_numbers(bias: float | None, clip: float | None, n_images: int | None) -> None:
    """Refuse a bias or clip that is not a finite number, a clip <= 0, fewer than 1 image."""
    from spdnn_mpi.errors import SpdnnError

    if bias is not None and not math.isfinite(bias):
        raise SpdnnError(f"--bias {bias}: must be a finite number")
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise SpdnnError(f"--clip {clip}: must be a finite number > 0 (or --no-clip)")
    with np.errstate(over="ignore"):  # the store keeps float32: 1e39 would become inf
        if bias is not None and not np.isfinite(np.float32(bias)):
            raise SpdnnError(f"--bias {bias}: must be a finite number as float32 "
                             f"(|bias| < {np.finfo(np.float32).max:.4g})")
        if clip is not None and not np.isfinite(np.float32(clip)):
            raise SpdnnError(f"--clip {clip}: must be a finite number > 0 as float32 "
                             f"(< {np.finfo(np.float32).max:.4g}), or --no-clip")
    if n_images is not None and n_images < 1:
        raise SpdnnError(f"--images {n_images}: must be at least 1")


def _add_computed_truth(writer, layers, rows, truth_layers, backend: str, progress: bool) -> None:
    """Compute and store the categories after each of ``truth_layers`` layers."""
    from spdnn_mpi.truth import resolve_truth_backend, truth_by_count
    from spdnn_mpi.util.progress import stderr_lines

    name, fn = resolve_truth_backend(backend)
    t0 = time.perf_counter()
    emit = stderr_lines("spdnn prepare") if progress else None
    for n_l, ids in truth_by_count(fn, layers, rows, truth_layers, emit, name):
        writer.add_truth(n_l, ids, name)
        _log(progress, f"truth after {n_l} layers ({name}): {len(ids)} of {rows.n_rows} "
                       f"images survive, {time.perf_counter() - t0:.1f} s")


def convert_tree(
    root: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    neurons: list[int] | None = None,
    split: bool = False,
    force: bool = False,
    progress: bool = True,
    jobs: int = 1,
) -> list[Path]:
    """Convert every network of an official tree into stores; returns their paths.

    One store per N, ``neuron{N}-l{L}.h5`` with all L layers found and every
    truth file that fits; with ``split``, one store per truth file instead
    (``neuron{N}-l{L}.h5`` holding the first L layers), as the 120- and
    480-layer networks are the first layers of the 1920-layer one. A network
    given as its archive is read as deep as its deepest truth file (all of it,
    into ``neuron{N}.h5``, where it has none); with ``split`` the archive is
    read once a store. Every
    output is checked before the first network is read, so a store that is
    in the way stops the run at once, not after hours of conversion.
    Errors name the command's options (``--tree``, ``--out-dir``, ``--neurons``).
    """
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.formats.tsv import tree as tsv_tree
    from spdnn_mpi.util.outputs import check_output

    if not Path(root).is_dir():
        raise SpdnnError(f"--tree {root}: no such folder")
    nets = tsv_tree.scan_tree(root)
    if neurons:
        nets = [n for n in nets if n.neurons in neurons]
    if not nets:
        wanted = f" for --neurons {' '.join(map(str, neurons))}" if neurons else ""
        raise SpdnnError(f"--tree {root}: no neuron{{N}} folder with layer files and no "
                         f"neuron{{N}}.tar.gz archive{wanted}")
    out_dir = check_output(out_dir, "--out-dir", directory=True)
    stores = []
    for net in nets:
        if net.n_layers is None:  # an archive: as deep as its deepest truth file (the
            fits = dict(net.categories)  # official ones are), or all of it without one
            deepest = max(fits) if fits else None
        else:
            fits = {n_l: p for n_l, p in net.categories.items() if n_l <= net.n_layers}
            deepest = net.n_layers
            for n_l, p in net.categories.items():
                if n_l > net.n_layers:
                    _log(progress, f"skipping {p}: {n_l} layers wanted, {net.n_layers} found")
        for n_l, truth in ([(n_l, {n_l: p}) for n_l, p in fits.items()] if split and fits
                           else [(deepest, fits)]):
            out = out_dir / (f"neuron{net.neurons}-l{n_l}.h5" if n_l is not None
                             else f"neuron{net.neurons}.h5")
            check_output(out, "--out-dir", force=force,
                         inputs={"the images file": net.images,
                                 **{f"the truth file {p.name}": p for p in truth.values()}})
            stores.append((net, n_l, truth, out))
    written = []
    for i, (net, n_l, truth, out) in enumerate(stores, start=1):
        _log(progress, f"store {i}/{len(stores)}: N={net.neurons}, {n_l or 'all'} layers "
                       f"of {net.weights_dir.name}, {len(truth)} truth file(s) -> {out}")
        written.append(prepare_store(net.weights_dir, out, neurons=net.neurons, n_layers=n_l,
                                     inputs=net.images, categories=truth, force=force,
                                     progress=progress, jobs=jobs))
    return written
