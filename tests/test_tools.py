"""Smoke tests of the maintained scripts in tools/: they parse, answer --help, and
fetch_challenge.sh works against a local mirror without touching the network."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
#: The tools kept (maintained and documented); a new script belongs here with a test.
KEPT = {"compile_kernels.sh", "device_run.sh", "fetch_challenge.sh", "profile_layers.py",
        "prune_mnist.py"}


def run(*argv: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_tools_holds_only_the_maintained_tools():
    assert {p.name for p in TOOLS.iterdir() if p.is_file()} == KEPT


@pytest.mark.parametrize("script", sorted(s for s in KEPT if s.endswith(".sh")))
def test_shell_scripts_parse(script):
    res = run("bash", "-n", str(TOOLS / script))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("argv, words", [
    (["bash", "fetch_challenge.sh", "--help"], ["usage: fetch_challenge.sh", "--dest", "N"]),
    (["bash", "fetch_challenge.sh", "-h"], ["usage: fetch_challenge.sh"]),
    (["bash", "device_run.sh", "--help"], ["STEPS", "Steps", "profile"]),
    ([sys.executable, "profile_layers.py", "--help"], ["usage:", "--define NAME=INT", "--model"]),
    ([sys.executable, "prune_mnist.py", "--help"], ["usage:", "--out", "--sparsities"]),
])
def test_tool_answers_help(argv, words):
    res = run(*argv[:1], str(TOOLS / argv[1]), *argv[2:])
    assert res.returncode == 0, res.stderr
    for word in words:
        assert word in res.stdout, (word, res.stdout)
    assert res.stderr == ""


def test_device_run_header_documents_exactly_its_steps(tmp_path):
    text = (TOOLS / "device_run.sh").read_text()
    header = run("bash", str(TOOLS / "device_run.sh"), "--help").stdout
    documented = re.findall(r"^  ([a-z]+) {2,}", header.split("Steps", 1)[1], re.M)
    run_steps = re.findall(r"\$steps == \*([a-z]+)\*", text)
    allowed = re.search(r"^ {4}([a-z|]+)\) ;;$", text, re.M).group(1).split("|")
    assert documented == allowed
    assert set(run_steps) == set(documented) == {"tests", "mpi", "real", "challenge", "models",
                                                 "answer", "profile"}
    assert "python3 -m pytest -m gpu" in text
    for gone in ("gpu_sparse", "model_layers", "model_run_probe", "sweep", "locality"):
        assert gone not in text, gone
    res = run("bash", str(TOOLS / "device_run.sh"), env={"STEPS": "tests sweep",
                                                         "OUT": str(tmp_path / "out")})
    assert res.returncode == 2 and "unknown step 'sweep'" in res.stderr
    res = run("bash", str(TOOLS / "device_run.sh"), env={
        "STEPS": "challenge", "BASELINE": str(tmp_path), "OUT": str(tmp_path / "out")})
    assert res.returncode == 2 and "is not a tree of this project" in res.stderr


@pytest.mark.parametrize("argv, message", [
    ([], "give at least one N"),
    (["1000"], "N must be 1024, 4096, 16384 or 65536, got '1000'"),
    (["-l", "100", "1024"], "layer counts must be 120, 480 or 1920, got '100'"),
    (["--bogus", "1024"], "unknown option --bogus"),
])
def test_fetch_challenge_refuses_bad_arguments_before_any_download(tmp_path, argv, message):
    dest = tmp_path / "dest"
    res = run("bash", str(TOOLS / "fetch_challenge.sh"), "-d", str(dest), *argv,
              env={"SPDNN_CHALLENGE_URL": "http://127.0.0.1:9/unused"})
    assert res.returncode == 1 and message in res.stderr
    assert not dest.exists()


def test_fetch_challenge_says_when_the_source_cannot_be_reached(tmp_path):
    dest = tmp_path / "dest"
    res = run("bash", str(TOOLS / "fetch_challenge.sh"), "-d", str(dest), "1024",
              env={"SPDNN_CHALLENGE_URL": f"file://{tmp_path}/no-mirror"})
    assert res.returncode == 1 and "cannot reach" in res.stderr
    assert not dest.exists()


def test_fetch_challenge_from_a_local_mirror(tmp_path):
    """The whole path (download, check, unpack, count) from a file:// mirror."""
    mirror = tmp_path / "mirror"
    (mirror / "dnn").mkdir(parents=True)
    (mirror / "mnist").mkdir()
    (mirror / "dnn" / "neuron1024-l120-categories.tsv").write_text("1\n7\n")
    (mirror / "mnist" / "sparse-images-1024.tsv.gz").write_bytes(gzip.compress(b"1\t1\t1\n"))
    layers = tmp_path / "neuron1024"
    layers.mkdir()
    for k in (1, 2, 3):
        (layers / f"n1024-l{k}.tsv").write_text("1\t1\t0.0625\n")
    with tarfile.open(mirror / "dnn" / "neuron1024.tar.gz", "w:gz") as tar:
        tar.add(layers, arcname="neuron1024")
    dest = tmp_path / "dest"
    res = run("bash", str(TOOLS / "fetch_challenge.sh"), "-d", str(dest), "-l", "120", "1024",
              env={"SPDNN_CHALLENGE_URL": f"file://{mirror}"})
    assert res.returncode == 0, res.stderr
    assert "neuron1024 holds 3 layer files" in res.stdout
    assert f"next: spdnn prepare --tree {dest} --out-dir STORE_DIR" in res.stdout
    assert (dest / "neuron1024-l120-categories.tsv").read_text() == "1\n7\n"
    assert (dest / "sparse-images-1024.tsv.gz").exists()
    assert not (dest / "neuron1024.tar.gz").exists()  # removed unless --keep-archive
    assert not list(dest.glob("*.part"))
