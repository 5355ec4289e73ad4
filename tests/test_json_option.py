"""`--json FILE` means the same in every subcommand: FILE is written, '-' is standard
output (then stdout holds the JSON alone), and a bare `--json` is a usage error."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import options, subparsers, write_random_store

from spdnn_mpi.cli import main

#: every subcommand with --json, and what must be in its JSON
WITH_JSON = {"info": "n_layers", "import": "layers", "infer": "n_images", "bench": "results",
             "demo": "n_images"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small store, a small safetensors model and a cache folder for the demo."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    d = tmp_path_factory.mktemp("json")
    write_random_store(d / "s.h5")
    rng = np.random.default_rng(5)
    safetensors_numpy.save_file({"fc0.weight": rng.normal(size=(6, 8)).astype(np.float32),
                                 "fc0.bias": np.zeros(6, np.float32),
                                 "fc1.weight": rng.normal(size=(3, 6)).astype(np.float32),
                                 "fc1.bias": np.zeros(3, np.float32)},
                                str(d / "m.safetensors"))
    np.save(d / "x.npy", rng.random((20, 8)).astype(np.float32))
    return d


def argv_for(name: str, d) -> list[str]:
    """A quick run of subcommand ``name`` on the fixture's files, without --json."""
    return {
        "info": ["info", str(d / "s.h5")],
        "import": ["import", str(d / "m.safetensors"), "--out", str(d / "m.h5"), "--force",
                   "--inputs", str(d / "x.npy")],
        "infer": ["infer", str(d / "s.h5"), "--backend", "cpu", "--quiet"],
        "bench": ["bench", str(d / "s.h5"), "--backend", "cpu", "--repeat", "1",
                  "--compress", "off", "--quiet"],
        "demo": ["demo", "--images", "200", "--cache-dir", str(d / "cache"), "--backend",
                 "cpu", "--quiet"],
    }[name]


def test_every_subcommand_with_json_takes_a_file():
    with_json = {name for name, p in subparsers().items() if "--json" in options(p)}
    assert with_json == set(WITH_JSON)
    helps = {options(subparsers()[name])["--json"].help.split(" as JSON")[1]
             for name in WITH_JSON}
    assert len(helps) == 1 and "'-' writes it to standard output" in helps.pop()
    for name in WITH_JSON:
        action = options(subparsers()[name])["--json"]
        assert action.metavar == "FILE" and action.nargs is None and action.default is None


@pytest.mark.parametrize("name", list(WITH_JSON))
def test_json_file_is_written(name, files, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main([*argv_for(name, files), "--json", str(out)]) == 0
    assert WITH_JSON[name] in json.loads(out.read_text())


@pytest.mark.parametrize("name", list(WITH_JSON))
def test_json_dash_is_standard_output_and_nothing_else(name, files, tmp_path, capsys):
    assert main([*argv_for(name, files), "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert WITH_JSON[name] in json.loads(out)  # the whole of stdout is the JSON
    assert not (tmp_path / "-").exists() and not (files / "-").exists()
    if name in ("info", "infer", "demo", "bench"):  # the human output went to stderr
        assert err.strip()


@pytest.mark.parametrize("name", list(WITH_JSON))
def test_bare_json_is_a_usage_error_naming_the_option(name, files, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv_for(name, files), "--json"])
    assert exc.value.code == 2
    assert "argument --json: expected one argument" in capsys.readouterr().err


def test_info_json_dash_in_a_real_process(files):
    """Through a real standard output: nothing else (warnings, progress) lands in it."""
    run = subprocess.run([sys.executable, "-m", "spdnn_mpi.cli", "info", str(files / "s.h5"),
                          "--json", "-"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["n_layers"] == 4
    assert "network" in run.stderr  # the text summary, on stderr


def test_info_json_never_writes_over_its_store(files, capsys):
    before = (files / "s.h5").read_bytes()
    assert main(["info", str(files / "s.h5"), "--json", str(files / "s.h5")]) == 2
    assert "refusing to write over an input" in capsys.readouterr().err
    assert (files / "s.h5").read_bytes() == before


def test_import_json_and_out_may_not_be_one_file(files, capsys):
    same = str(files / "same.h5")
    assert main(["import", str(files / "m.safetensors"), "--out", same, "--json", same]) == 2
    assert "--out and --json are the same file" in capsys.readouterr().err


def test_infer_out_dash_writes_the_categories_to_standard_output(files, tmp_path, monkeypatch,
                                                                 capsys):
    """`--out -`: the categories alone on standard output, the summary on standard
    error, and no file named '-'."""
    monkeypatch.chdir(tmp_path)
    assert main(["infer", str(files / "s.h5"), "--backend", "cpu", "--quiet",
                 "--out", str(tmp_path / "c.tsv")]) == 0
    capsys.readouterr()
    assert main(["infer", str(files / "s.h5"), "--backend", "cpu", "--quiet", "--out", "-"]) == 0
    out, err = capsys.readouterr()
    assert out == (tmp_path / "c.tsv").read_text() and out.strip()
    assert "categories" in err and not (tmp_path / "-").exists()


def test_one_standard_output_for_out_and_json(files, capsys):
    assert main(["infer", str(files / "s.h5"), "--backend", "cpu", "--quiet", "--out", "-",
                 "--json", "-"]) == 2
    assert "--out - and --json - both ask for standard output" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["generate", "--neurons", "256", "--layers", "2",
                                   "--images", "10"],
                                  ["generate", "--neurons", "256", "--layers", "2",
                                   "--images", "10", "--tsv"]])
def test_a_store_or_folder_cannot_go_to_standard_output(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", "-", "--quiet"]) == 2
    assert "cannot go to standard output" in capsys.readouterr().err
    assert not (tmp_path / "-").exists()
