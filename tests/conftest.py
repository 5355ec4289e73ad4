"""Shared fixtures and helpers of the CPU and GPU tests: random networks, layers of
the CUDA kernels' kinds, inputs (random, duplicated) and stores, and the location
of the real challenge data. Test modules import them (``from conftest import ...``);
tests/gpu has its own conftest (a package: ``gpu.conftest``) and helpers."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pytest

from spdnn_mpi.model import Layer, Network, SparseRows


def challenge_dir() -> Path:
    """../shared/graphchallenge beside the checkout (SPDNN_CHALLENGE_DIR overrides)."""
    env = os.environ.get("SPDNN_CHALLENGE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "shared" / "graphchallenge"


@pytest.fixture
def real_dir() -> Path:
    path = challenge_dir() / "neuron1024"
    if not path.is_dir():
        pytest.skip(f"real challenge network not found at {path} (set SPDNN_CHALLENGE_DIR)")
    return path


def random_network(
    rng: np.random.Generator,
    widths: list[int],
    density: float = 0.2,
    *,
    uniform: bool = False,
    bias: str = "scalar",
    clip: float | None = 32.0,
    activations: str | list[str] = "relu",
) -> Network:
    """A random sparse MLP with the given layer widths.

    bias: "scalar" (negative), "vector" (per neuron, mostly negative),
    "positive" (some per-neuron biases > 0, so dead rows may not be dropped).
    activations: one name for every layer, "mixed" (each layer ReLU or none at
    random), or one name per layer.
    """
    n_layers = len(widths) - 1
    if activations == "mixed":
        acts = [str(a) for a in rng.choice(["relu", "none"], n_layers)]
    elif isinstance(activations, str):
        acts = [activations] * n_layers
    else:
        acts = list(activations)
    layers = []
    for (n_in, n_out), act in zip(zip(widths[:-1], widths[1:]), acts):
        mask = rng.random((n_in, n_out)) < density
        i, j = np.nonzero(mask)
        vals = np.full(len(i), 0.25) if uniform else rng.normal(0.3, 0.5, len(i))
        if bias == "scalar":
            b: float | np.ndarray = float(-rng.uniform(0.05, 0.5))
        elif bias == "vector":
            b = rng.uniform(-0.6, 0.05, n_out).astype(np.float32)
        else:
            b = rng.uniform(-0.3, 0.3, n_out).astype(np.float32)
        layers.append(Layer.from_coo(i, j, vals, n_in, n_out, bias=b, clip=clip,
                                     activation=act))
    return Network(layers)


def random_inputs(rng: np.random.Generator, n_rows: int, n_cols: int, density: float = 0.1,
                  binary: bool = True) -> SparseRows:
    dense = (rng.random((n_rows, n_cols)) < density).astype(np.float32)
    if not binary:
        dense *= rng.uniform(0.1, 2.0, dense.shape).astype(np.float32)
    return SparseRows.from_dense(dense)


def duplicated_rows(rng, n_distinct: int, copies: int, width: int, binary=True) -> SparseRows:
    """Inputs where every distinct row appears ``copies`` times, shuffled."""
    base = random_inputs(rng, n_distinct, width, 0.2, binary).to_dense()
    dense = np.repeat(base, copies, axis=0)
    return SparseRows.from_dense(dense[rng.permutation(len(dense))])


def saturating(rng, width: int, n_layers: int, degree: int = 8, clip: float = 4.0) -> Network:
    """Random positive weights with a low clip: rows saturate into a few patterns."""
    layers = []
    for _ in range(n_layers):
        idx = np.stack([np.sort(rng.choice(width, degree, replace=False)) for _ in range(width)])
        vals = rng.uniform(0.5, 2.0, idx.size).astype(np.float32)
        indptr = np.arange(0, width * degree + 1, degree, dtype=np.int64)
        bias = rng.uniform(-0.6, -0.05, width).astype(np.float32)
        layers.append(Layer(width, width, indptr, idx.ravel().astype(np.uint16), vals, None,
                            bias, clip))
    return Network(layers)


def record_cuts(monkeypatch, backend) -> list[int]:
    """The layers run at each ``flush`` of ``backend`` (where the engine cuts its queue),
    appended to the returned list as the run goes."""
    layers_run, cuts = [0], []
    run_layer = backend.run_layer
    monkeypatch.setattr(backend, "run_layer",
                        lambda k, drop: layers_run.__setitem__(0, k + 1) or run_layer(k, drop))
    monkeypatch.setattr(backend, "flush", lambda: cuts.append(layers_run[0]))
    return cuts


def fixed_degree_layer(rng, n_in, n_out, degree, *, bias=-0.3, clip=32.0, value=1 / 16):
    """``n_out`` outputs of ``degree`` random inputs each (16-bit indices, sorted), one
    weight ``value`` for all: the layers of the ELL and grouped CUDA kernels."""
    idx = np.sort(np.stack([rng.choice(n_in, degree, replace=False) for _ in range(n_out)]),
                  axis=1)
    indptr = np.arange(0, degree * n_out + 1, degree, dtype=np.int64)
    return Layer(n_in, n_out, indptr, idx.ravel().astype(np.uint16), None, value, bias, clip)


def block_layer(rng, n_in, n_out, degree, *, values=True, max_group=16, bias=-0.3,
                clip=32.0, min_group=1):
    """Outputs in groups (random sizes from ``min_group`` to ``max_group``, scattered
    over the output ids) that read the same ``degree`` inputs; random values per nonzero."""
    sizes = []
    while sum(sizes) < n_out:
        sizes.append(int(rng.integers(min_group, max_group + 1)))
    sizes[-1] -= sum(sizes) - n_out
    sets = [np.sort(rng.choice(n_in, degree, replace=False)) for _ in sizes]
    rows = np.concatenate([np.repeat(s[None], k, axis=0) for s, k in zip(sets, sizes)])
    rows = rows[rng.permutation(n_out)]
    indptr = np.arange(0, degree * n_out + 1, degree, dtype=np.int64)
    vals = rng.normal(0.2, 0.4, degree * n_out).astype(np.float32) if values else None
    return Layer(n_in, n_out, indptr, rows.ravel().astype(np.uint16), vals,
                 None if values else 1 / 16, bias, clip)


def write_random_store(path, *, seed: int = 21, n_images: int = 301, width: int = 48,
                       n_layers: int = 4, provenance: dict | None = None,
                       truth_layers: tuple[int, ...] = ()) -> tuple[Network, SparseRows]:
    """A store of a random uniform network (``n_layers`` layers of ``width``) and binary
    inputs, with the reference truth after all layers (then after each count in
    ``truth_layers``); returns the network and the inputs."""
    from spdnn_mpi.formats.store.reader import StoreWriter
    from spdnn_mpi.reference import reference_categories

    rng = np.random.default_rng(seed)
    net = random_network(rng, [width] * (n_layers + 1), 0.2, uniform=True)
    rows = random_inputs(rng, n_images, width, 0.25)
    with StoreWriter(path, provenance) as w:
        for layer in net.layers:
            w.add_layer(layer)
        w.write_inputs(rows)
        for k in (n_layers, *truth_layers):
            w.add_truth(k, reference_categories(net.truncated(k), rows), "reference")
    return net, rows


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs mounted in ``tmp_path`` (root only; skipped elsewhere), for full disks."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def as_schema_2(path) -> None:
    """Rewrite a packed (schema 3) store in place as schema 2, one group a layer: the
    older layout every reader must still accept."""
    import h5py

    from spdnn_mpi.formats.store.layers import DATASETS, row_attrs, spans
    from spdnn_mpi.formats.store.schema import layer_key

    with h5py.File(path, "r+") as f:
        net = f["network"]
        data = {name: net[name][()] for name in DATASETS if name in net}
        for k, row in enumerate(net["layers"][()]):
            g = net.create_group(layer_key(k))
            g.attrs.update(row_attrs(row))
            for name, (start, stop) in spans(row).items():
                key = "indices" if name.startswith("indices") else name
                g.create_dataset(key, data=data[name][start:stop])
        for name in ("layers", *data):
            del net[name]
        f.attrs["schema_version"] = 2


def layer_span(f, layer: int, name: str):
    """(dataset, start, stop) of 1-based ``layer``'s array ``name`` (indices, indptr,
    values, bias) in an open packed store."""
    from spdnn_mpi.formats.store.layers import spans

    row = f["network/layers"][layer - 1]
    for dataset, (start, stop) in spans(row).items():
        if dataset == name or (name == "indices" and dataset.startswith("indices")):
            return f["network"][dataset], start, stop
    raise KeyError(f"layer {layer} has no {name}")


def set_layer_item(f, layer: int, name: str, pos, value) -> None:
    """Overwrite entry ``pos`` of 1-based ``layer``'s array ``name`` in a packed store."""
    ds, start, stop = layer_span(f, layer, name)
    a = ds[start:stop]
    a[pos] = value
    ds[start:stop] = a


def set_layer_field(f, layer: int, field: str, value) -> None:
    """Overwrite one field of 1-based ``layer``'s row of a packed store's layer table."""
    table = f["network/layers"][()]
    table[layer - 1][field] = value
    f["network/layers"][...] = table


class FakeClock:
    """A clock the test moves by hand (``clock.now += 2.5``), for rate-limited progress."""

    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, by name, from the real ``spdnn`` parser."""
    from spdnn_mpi.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A parser's documented options (hidden aliases left out), by spelling."""
    return {s: a for a in p._actions for s in a.option_strings if a.help != argparse.SUPPRESS}
