"""The CPU backend calls every kernel a network needs before its run: after the
layout and a warm-up, inference meets no kernel signature that numba has not
compiled or loaded, so no first-call cost lands in the timed run; the report
says whether the kernels were compiled or came from numba's disk cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import block_layer, fixed_degree_layer, random_network

from spdnn_mpi.backends.cpu import dispatch
from spdnn_mpi.backends.cpu import kernels as cpu_kernels
from spdnn_mpi.backends.cpu import share as cpu_share
from spdnn_mpi.model import Layer, Network, SparseRows


def _signatures() -> dict[str, int]:
    return {f"{module.__name__}.{name}": len(d.signatures)
            for module in (cpu_kernels, cpu_share) for name, d in vars(module).items()
            if hasattr(d, "signatures") and hasattr(d, "stats")}


def _int32_layer(rng, n_in: int, n_out: int) -> Layer:
    """A valued layer whose indices are 32-bit (as for inputs wider than 65536)."""
    layer = random_network(rng, [n_in, n_out], 0.2).layers[0]
    return Layer(n_in, n_out, layer.indptr, np.asarray(layer.indices, np.int32),
                 layer.values, None, -0.2, 32.0)


def _mixed_network(rng) -> Network:
    """Layers of three kinds, in which some rows live and some die: shared sums; 32-bit
    indices with values; fixed degree sharing nothing (the first layer's kind until
    sums are looked for: only the layout tells them apart)."""
    shared = block_layer(rng, 96, 96, 8, values=False, min_group=4, bias=-0.1)
    return Network([
        Layer(96, 96, shared.indptr, shared.indices, None, 0.2, -0.1, 32.0),
        _int32_layer(rng, 96, 96),
        fixed_degree_layer(rng, 96, 96, 8, bias=-0.1, value=0.2),
    ])


def check_timed_run_calls_nothing_new(prepared: bool) -> dict:
    """Lay out (after ``prepare_kernels`` where ``prepared``, as on the first rank of a
    node), warm up as the driver does, then run: the signatures numba holds before and
    after the run, and whether the run's ids are the reference's."""
    from spdnn_mpi.backends.cpu.backend import CpuBackend
    from spdnn_mpi.check_policy import CheckCosts
    from spdnn_mpi.engine import run_inference
    from spdnn_mpi.reference import reference_infer

    rng = np.random.default_rng(7)
    net = _mixed_network(rng)
    dense = (rng.random((3, 96)) < np.array([[0.0], [0.3], [0.4]])).astype(np.float32)
    dense[0, 5] = 1.0  # one input: this row dies within the layers, the other two live
    rows = SparseRows.from_dense(np.repeat(dense, 120, axis=0))  # 360 rows, 3 distinct
    backend = CpuBackend()
    backend.check_costs = CheckCosts()  # free checks: every checkpoint merges
    if prepared:
        backend.prepare_kernels(net.layers)
    backend.load_network(net.layers)
    info = backend.describe()
    run_inference(net, rows.slice(0, 2), backend)  # the warm-up: the inputs' own scatter
    before = _signatures()
    direct = run_inference(net, rows, backend, want_features=True)  # every layer all tiles
    merged = run_inference(net, rows, backend, want_features=True, compress="auto")
    ids, _ = reference_infer(net, rows)
    return {"before": before, "after": _signatures(), "info": info,
            "same_ids": all(np.array_equal(r.alive_ids, ids) for r in (direct, merged)),
            "alive": len(ids), "live": direct.live_per_layer.tolist(), "rows": rows.n_rows,
            "computed": merged.computed_rows_per_layer.tolist()}


@pytest.mark.parametrize("prepared", [True, False])
def test_inference_meets_no_kernel_it_has_not_called(prepared, tmp_path):
    """Whole tiles, one tile's rows, a few rows, compactions, merges and the features
    read back: every call of the timed run has a signature called before it. In a
    fresh process, as numba keeps what a process called."""
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_cpu_dispatch "
              "as t; print(json.dumps(t.check_timed_run_calls_nothing_new(sys.argv[2] == "
              "'1')))")
    out = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__),
                          "1" if prepared else "0"], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"] == got["before"]
    assert got["same_ids"] and 0 < got["alive"] < got["rows"]
    live = got["live"]
    assert any(b * 10 <= a * 9 for a, b in zip(live, live[1:]))  # a tenth died: compacted
    assert got["computed"][-1] <= 4  # merged: the few-row forms ran
    assert got["info"]["compile_seconds"] > 0
    assert got["info"]["kernels_compiled"] in (True, False)


def test_a_second_network_reports_only_its_own_kernel_time():
    from spdnn_mpi.backends.cpu.backend import CpuBackend

    net = _mixed_network(np.random.default_rng(8))
    backend = CpuBackend()
    backend.load_network(net.layers)
    first = backend.describe()["compile_seconds"]
    backend.load_network(net.layers)  # every kind met already
    assert backend.describe()["compile_seconds"] < first


def test_entry_kinds_tell_apart_what_numba_types_apart():
    rng = np.random.default_rng(9)
    layer = fixed_degree_layer(rng, 40, 30, 4)
    entry = dispatch.layer_entry(layer, None)
    assert dispatch.entry_kind(entry) == dispatch.entry_kind(dispatch.layer_entry(layer, None))
    frozen = np.asarray(layer.indices).copy()
    frozen.flags.writeable = False
    read_only = Layer(layer.n_in, layer.n_out, layer.indptr, frozen, None, 1 / 16, -0.3, 32.0)
    wide = Layer(layer.n_in, layer.n_out, layer.indptr, np.asarray(layer.indices, np.int32),
                 None, 1 / 16, -0.3, 32.0)
    shared = dispatch.layer_entry(layer, cpu_share.shared_inputs(
        block_layer(rng, 40, 30, 4, values=False, min_group=4)))
    kinds = {dispatch.entry_kind(dispatch.layer_entry(x, None)) for x in (read_only, wide)}
    assert len(kinds | {dispatch.entry_kind(entry), dispatch.entry_kind(shared)}) == 4


def test_the_report_says_when_the_kernels_were_compiled(tmp_path):
    """An empty numba cache: 'kernels compiled'; the next run: 'from the cache'."""
    from conftest import write_random_store

    store = tmp_path / "s.h5"
    write_random_store(store, n_images=80)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    reports = []
    for run in range(2):
        out = subprocess.run(
            [sys.executable, "-m", "spdnn_mpi", "infer", str(store), "--backend", "cpu",
             "--json", str(tmp_path / f"r{run}.json"), "--out", str(tmp_path / "c.tsv")],
            env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        reports.append((json.loads((tmp_path / f"r{run}.json").read_text()), out.stdout))
    (first, first_text), (second, second_text) = reports
    assert first["kernels_compiled"] and "kernels compiled" in first_text
    assert not second["kernels_compiled"] and "kernels from the cache" in second_text
    assert second["compile_seconds"] < first["compile_seconds"]
