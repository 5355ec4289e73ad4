"""The overwrite rule (``spdnn_mpi.util.outputs``), subcommand by subcommand.

Results files (what infer, bench, demo, info and import report: categories,
JSON, plots) are made again on every run and replaced without --force; stores
and TSV trees (generate, prepare, import) are replaced only with --force.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_store

from spdnn_mpi.cli import main
from spdnn_mpi.formats.store.reader import Store

OLD = "an earlier run's output\n"


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """A store, an official TSV tree (N = 64) and a safetensors model."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    d = tmp_path_factory.mktemp("overwrite")
    write_random_store(d / "s.h5")
    assert main(["generate", "--neurons", "64", "--layers", "4", "--images", "40",
                 "--tsv", "--out", str(d / "tree"), "--quiet"]) == 0
    rng = np.random.default_rng(7)
    safetensors_numpy.save_file({"fc0.weight": rng.normal(size=(3, 8)).astype(np.float32),
                                 "fc0.bias": np.zeros(3, np.float32)},
                                str(d / "m.safetensors"))
    return d


def results_runs(d, out) -> dict[str, list[str]]:
    """Per subcommand, a run writing the results file ``out`` (never with --force)."""
    return {
        "infer --out": ["infer", str(d / "s.h5"), "--backend", "cpu", "--quiet",
                        "--out", str(out)],
        "infer --json": ["infer", str(d / "s.h5"), "--backend", "cpu", "--quiet",
                         "--json", str(out)],
        "bench --json": ["bench", str(d / "s.h5"), "--backend", "cpu", "--repeat", "1",
                         "--compress", "off", "--quiet", "--json", str(out)],
        "bench --plot": ["bench", str(d / "s.h5"), "--backend", "cpu", "--repeat", "1",
                         "--compress", "off", "--quiet", "--plot", str(out)],
        "demo --json": ["demo", "--images", "200", "--cache-dir", str(d / "cache"),
                        "--backend", "cpu", "--quiet", "--json", str(out)],
        "info --json": ["info", str(d / "s.h5"), "--json", str(out)],
        "import --json": ["import", str(d / "m.safetensors"), "--out", str(d / "m.h5"),
                          "--force", "--quiet", "--json", str(out)],
    }


RESULTS = list(results_runs(Path("d"), Path("out")))  # the names only


@pytest.mark.parametrize("which", RESULTS)
def test_an_existing_results_file_is_replaced_without_force(which, d, tmp_path, capsys):
    out = tmp_path / ("plot.png" if "plot" in which else "result")
    out.write_text(OLD)
    if which == "bench --plot":
        pytest.importorskip("matplotlib")
    assert main(results_runs(d, out)[which]) == 0, capsys.readouterr().err
    data = out.read_bytes()
    assert data != OLD.encode() and data
    if "--json" in which:
        json.loads(data)
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporaries left


def store_runs(d, out) -> dict[str, list[str]]:
    """Per subcommand, a run writing the store or tree ``out`` (without --force)."""
    tree = d / "tree"
    return {
        "generate": ["generate", "--neurons", "64", "--layers", "2", "--images", "20",
                     "--out", str(out), "--quiet"],
        "generate --tsv": ["generate", "--neurons", "64", "--layers", "2", "--images", "20",
                           "--tsv", "--out", str(out), "--quiet"],
        "prepare --weights": ["prepare", "--weights", str(tree / "neuron64"), "--inputs",
                              str(tree / "sparse-images-64.tsv"), "--out", str(out),
                              "--quiet"],
        "prepare --tree": ["prepare", "--tree", str(tree), "--out-dir", str(out), "--quiet"],
        "import": ["import", str(d / "m.safetensors"), "--out", str(out), "--quiet"],
    }


def _existing(which: str, out: Path) -> Path:
    """Put an earlier output where ``which`` writes; return the file that stands for it."""
    if which == "generate --tsv":
        out.mkdir()
        (out / "sparse-images-64.tsv").write_text(OLD)
        return out / "sparse-images-64.tsv"
    if which == "prepare --tree":
        out.mkdir()
        (out / "neuron64-l4.h5").write_text(OLD)
        return out / "neuron64-l4.h5"
    out.write_text(OLD)
    return out


@pytest.mark.parametrize("which", list(store_runs(Path("d"), Path("out"))))
def test_an_existing_store_needs_force(which, d, tmp_path, capsys):
    out = tmp_path / "out"
    earlier = _existing(which, out)
    argv = store_runs(d, out)[which]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "exists; pass --force to replace it" in err and str(earlier) in err
    assert earlier.read_text() == OLD
    assert main([*argv, "--force"]) == 0, capsys.readouterr().err
    if which == "generate --tsv":
        assert earlier.read_text() != OLD
    else:
        with Store(earlier) as st:
            assert st.n_layers >= 1


def test_check_output_states_the_rule(tmp_path):
    """results=True replaces whatever --force says; any other output needs force; an
    input is refused either way."""
    from spdnn_mpi.errors import SpdnnError
    from spdnn_mpi.util.outputs import check_output, check_outputs

    old = tmp_path / "old"
    old.write_text(OLD)
    assert check_output(old, "--json", results=True, force=False) == old
    with pytest.raises(SpdnnError, match="--out .* exists; pass --force to replace it"):
        check_output(old, "--out", force=False)
    check_output(old, "--out", force=True)
    with pytest.raises(SpdnnError, match="refusing to write over an input"):
        check_outputs({"--json": old}, {"the store": old}, results=True)
    assert old.read_text() == OLD  # a check writes nothing
