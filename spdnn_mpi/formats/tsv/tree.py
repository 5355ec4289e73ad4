"""Where the official TSV files of a network are: one folder's layers, a whole tree.

A network is a ``neuron{N}`` folder of ``n{N}-l{k}.tsv[.gz]`` files, with its
images ``sparse-images-{N}.tsv`` and truth ``neuron{N}-l{L}-categories.tsv``
anywhere under the tree's root (see docs/data.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spdnn_mpi.errors import InputFormatError
from spdnn_mpi.formats.tsv.text import Source, source_name
from spdnn_mpi.model import Layer

#: The official file names: layers, images and truth (docs/data.md).
LAYER_RE = re.compile(r"^n(\d+)-l(\d+)\.tsv(\.gz)?$")
IMAGES_RE = re.compile(r"^sparse-images-(\d+)\.tsv(\.gz)?$")
CATEGORIES_RE = re.compile(r"^neuron(\d+)-l(\d+)-categories\.tsv(\.gz)?$")


def layer_path(directory: str | os.PathLike, neurons: int, k: int) -> Path:
    """Path of 1-based layer ``k`` in a ``neuron{N}`` folder: ``.tsv``, else ``.tsv.gz``.

    Raises InputFormatError (naming the expected file) when neither exists.
    """
    base = Path(directory) / f"n{neurons}-l{k}.tsv"
    for p in (base, base.with_name(base.name + ".gz")):
        if p.is_file():
            return p
    for p in (base, base.with_name(base.name + ".gz")):
        if p.is_dir():
            raise InputFormatError(p, None, "is a directory, not a layer file")
    raise InputFormatError(base, None, f"missing layer file (no {base.name} or {base.name}.gz)")


def layer_files(directory: str | os.PathLike) -> dict[int, dict[int, Path]]:
    """All ``n{N}-l{k}.tsv[.gz]`` files of a folder: ``{N: {k: path}}`` (.tsv wins)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputFormatError(directory, None, "no such weights folder")
    try:
        entries = list(directory.iterdir())
    except OSError as exc:  # no read permission, an I/O error
        raise InputFormatError(directory, None, "cannot list the folder "
                                                f"({exc.strerror or exc})") from None
    found: dict[int, dict[int, Path]] = {}
    for p in sorted(entries, key=lambda q: q.name.endswith(".gz")):
        m = LAYER_RE.match(p.name)
        if m:
            found.setdefault(int(m.group(1)), {}).setdefault(int(m.group(2)), p)
    return found


def count_layers(directory: str | os.PathLike, neurons: int, *, gaps_ok: bool = False) -> int:
    """Number of consecutive layer files ``1..L`` present for ``neurons``.

    A layer file missing before the last one present (a gap) is an
    InputFormatError naming it, unless ``gaps_ok`` (then only 1..L count).
    """
    files = layer_files(directory).get(neurons, {})
    n = 0
    while n + 1 in files:
        n += 1
    if not gaps_ok and files and max(files) > n:
        missing = Path(directory) / f"n{neurons}-l{n + 1}.tsv"
        later = sorted(k for k in files if k > n)
        raise InputFormatError(
            missing, None,
            f"missing layer file (no {missing.name} or {missing.name}.gz), but layers "
            f"{later[0]}..{later[-1]} are there; pass --layers {n} to use only the first {n}"
            if n else f"missing layer file (no {missing.name} or {missing.name}.gz), but "
            f"layers {later[0]}..{later[-1]} are there",
        )
    return n


def infer_neurons(directory: str | os.PathLike) -> int:
    """N of a weights folder, from its name ``neuron{N}`` or its layer file names."""
    directory = Path(directory)
    m = re.fullmatch(r"neuron(\d+)", directory.name)
    if m:
        return int(m.group(1))
    ns = sorted(layer_files(directory))
    if len(ns) == 1:
        return ns[0]
    if not ns:
        raise InputFormatError(directory, None, "no n{N}-l{k}.tsv layer files found")
    raise InputFormatError(
        directory, None, f"layer files of several N ({ns}); pass the number of neurons"
    )


def read_checked_layer(
    path: Source,
    neurons: int,
    *,
    bias: float | np.ndarray = 0.0,
    clip: float | None = None,
    check_full: bool = True,
) -> Layer:
    """Read one layer file of a ``neuron{N}`` network (a path or an archive member).

    With ``check_full`` (challenge networks) the layer must use input and
    output neuron N somewhere, so a layer of a smaller network copied into
    the folder is caught even though all its ids are in range.
    """
    # here, not at import: locating files needs no parser, and `spdnn prepare` makes
    # its inputs in the background while this process imports numba (0.3 s)
    from spdnn_mpi.formats.tsv.read import read_layer

    layer = read_layer(path, neurons, neurons, bias=bias, clip=clip)
    if check_full:
        top_in = int(layer.indices.max()) + 1 if layer.nnz else 0
        nonempty = np.flatnonzero(np.diff(layer.indptr))
        top_out = int(nonempty[-1]) + 1 if len(nonempty) else 0
        if top_in != neurons or top_out != neurons:
            raise InputFormatError(
                source_name(path),
                None,
                f"layer uses neurons up to i={top_in}, j={top_out} but the network "
                f"has N={neurons}: it belongs to a different network",
            )
    return layer


def iter_layers(
    directory: str | os.PathLike,
    neurons: int,
    n_layers: int,
    *,
    bias: float | np.ndarray = 0.0,
    clip: float | None = None,
    check_full: bool = True,
) -> Iterator[Layer]:
    """Read layers ``1..n_layers`` of a ``neuron{N}`` folder one at a time, in this
    process (see :func:`read_checked_layer`; ``formats.tsv.layers`` reads in parallel)."""
    for k in range(1, n_layers + 1):
        yield read_checked_layer(layer_path(directory, neurons, k), neurons, bias=bias,
                                 clip=clip, check_full=check_full)


@dataclass
class TreeNetwork:
    """What an official tree holds for one N (see :func:`scan_tree`)."""

    neurons: int
    weights_dir: Path  # a ``neuron{N}`` folder, or a ``neuron{N}.tar.gz`` archive
    n_layers: int | None  # None: an archive, whose layers are counted as it is read
    images: Path | None = None
    categories: dict[int, Path] = field(default_factory=dict)


def scan_tree(root: str | os.PathLike) -> list[TreeNetwork]:
    """Find every network in an official tree (searched recursively), sorted by N.

    A network is a ``neuron{N}`` folder with layer files ``1..L``, else an official
    archive ``neuron{N}.tar.gz`` (as downloaded; a folder of N wins); the images
    ``sparse-images-{N}.tsv[.gz]`` and truth ``neuron{N}-l{L}-categories.tsv``
    may sit anywhere under ``root``.
    """
    from spdnn_mpi.formats.tsv.archive import ARCHIVE_RE

    root = Path(root)
    if not root.is_dir():
        raise InputFormatError(root, None, "no such folder")
    nets: dict[int, TreeNetwork] = {}
    images: dict[int, Path] = {}
    archives: dict[int, Path] = {}
    cats: dict[int, dict[int, Path]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        d = Path(dirpath)
        m = re.fullmatch(r"neuron(\d+)", d.name)
        if m and int(m.group(1)) not in nets:
            n = int(m.group(1))
            count = count_layers(d, n)
            if count:
                nets[n] = TreeNetwork(n, d, count)
        for name in sorted(filenames):
            if (mi := IMAGES_RE.match(name)) and int(mi.group(1)) not in images:
                images[int(mi.group(1))] = d / name
            elif mc := CATEGORIES_RE.match(name):
                cats.setdefault(int(mc.group(1)), {}).setdefault(int(mc.group(2)), d / name)
            elif ma := ARCHIVE_RE.match(name):
                archives.setdefault(int(ma.group(1)), d / name)
    for n, path in archives.items():
        nets.setdefault(n, TreeNetwork(n, path, None))
    for n, net in nets.items():
        net.images = images.get(n)
        net.categories = dict(sorted(cats.get(n, {}).items()))
    return [nets[n] for n in sorted(nets)]


