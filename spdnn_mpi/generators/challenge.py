"""A challenge-shaped network (``radixnet``), inputs from real digits (``digits``) and
truth, into one store or the official TSV layout, written atomically with the layers
streamed one at a time.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.truth import (
    TruthFn,
    check_truth_memory,
    kept_layer_bytes,
    resolve_truth_backend,
    truth_by_count,
)
from spdnn_mpi.util.progress import Emit, Progress, stderr_lines


def _reporting(layers: Iterable, total: int, emit: Emit | None, keep: list,
               keep_first: int) -> Iterator:
    """Pass layers through, keeping the first ``keep_first`` and reporting progress."""
    progress = Progress("", total, emit)
    t0 = time.perf_counter()
    edges = 0
    for k, layer in enumerate(layers, start=1):
        yield layer  # the consumer writes it before the next one is made
        edges += layer.nnz
        if k <= keep_first:
            keep.append(layer)
        dt = max(time.perf_counter() - t0, 1e-9)
        progress(k, f"written, {edges / dt / 1e6:.0f} M edges/s")


#: Fraction of the pixels on in the digit images, a little above what was measured
#: (0.088 at N = 64, 0.098 at 256, 0.102 from 1024 on, 2000 images, default threshold).
INPUT_DENSITY = 0.11
#: Bytes of HDF5 metadata per stored layer (group and attributes; about 2 KB measured).
LAYER_OVERHEAD = 2048
#: TSV lines formatted at once by the writer (``formats.tsv.write``).
TSV_BLOCK = 1 << 22


def output_bytes(neurons: int, layers: int, images: int, n_truth: int, tsv: bool) -> int:
    """About how many bytes the store (or with ``tsv`` the TSV tree) of this request takes."""
    from spdnn_mpi.generators.radixnet import DEGREE

    edges = DEGREE * neurons * layers
    pixels = int(INPUT_DENSITY * images * neurons)
    index = 2 if neurons <= 65536 else 4
    if tsv:
        digits_n, digits_i = len(str(neurons)), len(str(images))
        return (edges * (2 * digits_n + 15) + pixels * (digits_i + digits_n + 4)
                + n_truth * images * (digits_i + 1))
    return (edges * index + layers * LAYER_OVERHEAD + pixels * index + 8 * (images + 1)
            + n_truth * 8 * images + (1 << 16))


def generation_bytes(neurons: int, images: int, tsv: bool) -> int:
    """Host memory generating takes besides the truth: the inputs, two layers in flight
    and, for TSV, a block of formatted lines."""
    index = 2 if neurons <= 65536 else 4
    inputs = int(INPUT_DENSITY * images * neurons) * index + 8 * (images + 1)
    lines = TSV_BLOCK * (2 * len(str(neurons)) + 16) if tsv else 0
    return inputs + 2 * kept_layer_bytes(neurons) + lines


def check_size(path: Path, neurons: int, layers: int, images: int, n_truth: int,
               tsv: bool) -> None:
    """Refuse at once a request whose output cannot fit on the disk or whose generation
    cannot fit in memory, naming the numbers."""
    from spdnn_mpi.util.memory import require
    from spdnn_mpi.util.outputs import check_space

    check_space(path, output_bytes(neurons, layers, images, n_truth, tsv), "--out")
    require(generation_bytes(neurons, images, tsv),
            f"generating N = {neurons} with {images} images",
            "use fewer --images or a smaller --neurons")


def _check_truth_layers(truth_layers: Sequence[int] | None, layers: int) -> list[int]:
    wanted = [layers] if truth_layers is None else sorted({int(t) for t in truth_layers})
    bad = [t for t in wanted if not 1 <= t <= layers]
    if bad:
        raise SpdnnError(f"truth layer counts {bad} outside 1..{layers} (the generated depth)")
    return wanted


def _check_out(path: Path, neurons: int, wanted: list[int], tsv: bool, force: bool,
               mnist_dir: str | os.PathLike | None) -> None:
    """Refuse an output that exists (unless ``force``), cannot be written, or is an input."""
    from spdnn_mpi.util.outputs import check_output, check_outputs

    inputs = {}
    if mnist_dir is not None and Path(mnist_dir).is_dir():
        inputs = {f"an input in --mnist-dir {mnist_dir}": p for p in Path(mnist_dir).iterdir()}
    if not tsv:
        check_outputs({"--out": path}, inputs, force=force, regular=True)
        return
    check_output(path, "--out", inputs=inputs, force=force, directory=True)
    names = [f"neuron{neurons}", f"sparse-images-{neurons}.tsv"]
    names += [f"neuron{neurons}-l{n}-categories.tsv" for n in wanted]
    for name in names:
        target = path / name
        if target.exists() and not force:
            raise SpdnnError(f"--out {path}: {target} exists; pass --force to replace it")
        check_output(target, "--out", inputs=inputs, force=force, directory=name == names[0])


def generate_store(
    path: str | os.PathLike,
    neurons: int,
    layers: int,
    seed: int,
    images: int = 60000,
    truth_layers: Sequence[int] | None = None,
    truth_backend: str | TruthFn | None = "reference",
    mnist_dir: str | os.PathLike | None = None,
    progress: Emit | None = None,
    *,
    shuffle: str = "cycle",
    threshold: int | None = None,
    tsv: bool = False,
    quiet: bool = True,
    force: bool = False,
) -> dict:
    """Generate network, inputs and truth into a store at ``path`` (or a TSV tree with ``tsv``).

    ``truth_layers`` defaults to ``[layers]``; ``truth_backend``: a name in
    ``TRUTH_BACKENDS`` or a callable. Progress lines go to ``progress``, or to stderr
    unless ``quiet``. Returns the provenance written, with the truth counts.
    """
    from spdnn_mpi import __version__
    from spdnn_mpi.generators.digits import (
        DEFAULT_THRESHOLD,
        digit_images,
        images_provenance,
        load_digits,
    )
    from spdnn_mpi.generators.radixnet import iter_radixnet, radixnet_provenance

    if progress is None and not quiet:
        progress = stderr_lines("spdnn generate")
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    try:
        layer_stream = iter_radixnet(neurons, layers, seed, shuffle)
    except ValueError as exc:
        raise SpdnnError(str(exc)) from None
    if images < 1:
        raise SpdnnError(f"images must be >= 1, got {images}")
    truth_name, truth_fn = resolve_truth_backend(truth_backend)
    wanted = _check_truth_layers(truth_layers, layers) if truth_fn is not None else []
    _check_out(Path(path), neurons, wanted, tsv, force, mnist_dir)
    check_size(Path(path), neurons, layers, images, len(wanted), tsv)
    if wanted:  # before hours of layers, not after: the kept layers count too
        check_truth_memory(truth_name, truth_fn, images, neurons,
                           extra=max(wanted) * kept_layer_bytes(neurons))

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
        for n, ids in truth_by_count(truth_fn, kept, rows, wanted, progress, truth_name):
            out.append((n, ids))
            if progress is not None:
                progress(
                    f"truth after {n} layers ({truth_name}): {len(ids)} of {images} images "
                    f"survive, {time.perf_counter() - t1:.1f} s"
                )
        provenance["truth_counts"] = {str(n): len(ids) for n, ids in out}
        return out

    if tsv:
        from spdnn_mpi.formats.tsv.write import write_categories, write_tree
        from spdnn_mpi.util.atomic import atomic_tree

        with atomic_tree(path) as out_dir:  # the whole tree appears at once, or nothing
            write_tree(out_dir, stream, rows)
            for n, ids in compute_truth():
                write_categories(out_dir / f"neuron{neurons}-l{n}-categories.tsv", ids)
    else:
        from spdnn_mpi.formats.store.reader import StoreWriter

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


def generated_store_name(neurons: int, layers: int, images: int, seed: int) -> str:
    """The file name of a cached generated store: the parameters that make it."""
    return f"radixnet-n{neurons}-l{layers}-i{images}-s{seed}.h5"


def _truth_layers_of(path: Path) -> set[int] | None:
    """The truth layer counts of the store at ``path``; None when it cannot be read."""
    from spdnn_mpi.formats.store.reader import Store

    try:
        with Store(path) as store:
            return set(store.truth_layers())
    except (SpdnnError, OSError):
        return None


def _serves(path: Path, neurons: int, layers: int, images: int, seed: int,
            truth_layers: Sequence[int]) -> bool:
    """Whether the store at ``path`` is a default generation of these parameters, at
    least ``layers`` deep, with truth after each of ``truth_layers`` layers."""
    from spdnn_mpi.formats.store.reader import Store
    from spdnn_mpi.generators.digits import DEFAULT_THRESHOLD

    try:
        with Store(path) as store:
            prov = store.provenance
            net, inputs = prov.get("network") or {}, prov.get("inputs") or {}
            return (prov.get("generator") == "spdnn_mpi.generate"
                    and (prov.get("neurons"), prov.get("seed")) == (neurons, seed)
                    and net.get("shuffle") == "cycle"
                    and inputs.get("threshold") == DEFAULT_THRESHOLD
                    and store.n_layers >= layers and store.n_images == images
                    and set(truth_layers) <= set(store.truth_layers()))
    except (SpdnnError, OSError, AttributeError):
        return False  # unreadable or not a generated store: made again


def find_generated_store(directory: str | os.PathLike, neurons: int, layers: int,
                         images: int, seed: int,
                         truth_layers: Sequence[int] = ()) -> Path | None:
    """The shallowest cached store in ``directory`` that serves this request, else None
    (layer k depends only on N, k and the seed, so a deeper store serves too)."""
    pattern = re.compile(rf"radixnet-n{neurons}-l(\d+)-i{images}-s{seed}\.h5")
    found = []
    for path in Path(directory).glob(f"radixnet-n{neurons}-l*-i{images}-s{seed}.h5"):
        m = pattern.fullmatch(path.name)
        if m and int(m.group(1)) >= layers:
            found.append((int(m.group(1)), path))
    for _, path in sorted(found):
        if _serves(path, neurons, layers, images, seed, truth_layers):
            return path
    return None


def cached_generated_store(directory: str | os.PathLike, neurons: int, layers: int,
                           images: int, seed: int, truth_layers: Sequence[int] = (), *,
                           regenerate: bool = False, log: Callable[[str], None] | None = None,
                           quiet: bool = True) -> Path:
    """A generated store for this request from the cache ``directory``, generated there
    first when none serves it (or ``regenerate``), keeping the truth a store of the
    same name had. ``log`` gets the store used, or the one generated and its time.
    """
    found = None if regenerate else find_generated_store(directory, neurons, layers, images,
                                                         seed, truth_layers)
    if found is not None:
        if log is not None:
            log(f"using cached {found}")
        return found
    path = Path(directory) / generated_store_name(neurons, layers, images, seed)
    kept = (_truth_layers_of(path) if path.exists() else None) or set()
    truth = sorted(set(truth_layers) | kept)
    if log is not None:
        log(f"generating {path} (truth after {', '.join(map(str, truth)) or 'no'} layers)")
    t0 = time.perf_counter()
    generate_store(path, neurons, layers, seed, images=images, truth_layers=truth,
                   quiet=quiet, force=True)
    if log is not None:
        log(f"generated {path.name} in {time.perf_counter() - t0:.1f} s")
    return path
