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
KEPT = {"compare_bench.py", "compile_kernels.sh", "device_run.sh", "fetch_challenge.sh",
        "host_split.py", "profile_layers.py", "prune_mnist.py"}


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
    ([sys.executable, "host_split.py", "--help"], ["usage:", "--model SPARSITY", "--runs"]),
    ([sys.executable, "prune_mnist.py", "--help"], ["usage:", "--out", "--sparsities"]),
    ([sys.executable, "compare_bench.py", "--help"], ["usage:", "--before", "--after", "--json"]),
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


def _bench_json(path: Path, teps: dict[str, tuple[float, float]], *, device: str = "card",
                passed: bool = True) -> Path:
    """A challenge bench JSON with these configurations' (off, auto) TE/s."""
    import json

    check = {"against": "off", "passed": passed}
    results = [{"neurons": int(c.split("x")[0]), "layers": int(c.split("x")[1]),
                "backend_info": {"device": device}, "peers": {},
                "modes": {"off": {"teraedges_per_second": off, "check": {"passed": True}},
                          "auto": {"teraedges_per_second": auto, "check": check,
                                   "same_as_off": passed}}}
               for c, (off, auto) in teps.items()]
    path.write_text(json.dumps({"results": results}))
    return path


def test_compare_bench_gives_medians_and_the_rounds_ratio_range(tmp_path):
    b1 = _bench_json(tmp_path / "b1.json", {"1024x120": (100.0, 200.0), "4096x120": (50.0, 60.0)})
    b2 = _bench_json(tmp_path / "b2.json", {"1024x120": (110.0, 200.0)})
    a1 = _bench_json(tmp_path / "a1.json", {"1024x120": (99.0, 220.0), "4096x120": (55.0, 60.0)})
    a2 = _bench_json(tmp_path / "a2.json", {"1024x120": (121.0, 180.0)})
    out = tmp_path / "cmp.json"
    res = run(sys.executable, str(TOOLS / "compare_bench.py"), "--before", str(b1), str(b2),
              "--after", str(a1), str(a2), "--json", str(out))
    assert res.returncode == 0, res.stderr
    lines = {tuple(line.split()[:2]): line.split() for line in res.stdout.splitlines()[1:]}
    # off at 1024 x 120: medians 105 -> 110, rounds 0.99 and 1.10
    assert lines[("1024x120", "off")][2:6] == ["105.0", "110.0", "1.048", "0.990-1.100"]
    assert lines[("1024x120", "auto")][5] == "0.900-1.100"
    assert lines[("4096x120", "off")][2:6] == ["50.0", "55.0", "1.100", "1.100"]  # one round
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == ["1024x120", "4096x120"]
    assert rows[0]["off"]["round_ratios"] == pytest.approx([0.99, 1.1])


def test_compare_bench_says_when_a_check_failed_or_the_cards_differ(tmp_path):
    good = _bench_json(tmp_path / "good.json", {"1024x120": (100.0, 200.0)})
    bad = _bench_json(tmp_path / "bad.json", {"1024x120": (100.0, 200.0)}, passed=False)
    other = _bench_json(tmp_path / "other.json", {"1024x120": (100.0, 200.0)}, device="H200")
    cmp = [sys.executable, str(TOOLS / "compare_bench.py"), "--before", str(good), "--after"]
    res = run(*cmp, str(bad))
    assert res.returncode == 1 and "FAILED" in res.stdout
    res = run(*cmp, str(other))
    assert res.returncode == 1 and "devices differ: H200, card" in res.stdout
    (tmp_path / "junk.json").write_text("{}")
    res = run(*cmp, str(tmp_path / "junk.json"))
    assert res.returncode != 0 and "junk.json: not a challenge bench JSON" in res.stderr


def test_device_run_alternates_the_trees_and_compares_them(tmp_path):
    """BASELINE_ROUNDS=2 runs the older tree and this one in turn twice, later rounds
    without peers, and prints tools/compare_bench.py's table (python3 faked: no GPU)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls.log"
    (fake / "python3").write_text(f"""#!/usr/bin/env bash
if [[ "$1 $2 $3" == "-m spdnn_mpi bench" ]]; then
  echo "$PWD $*" >> {log}
  while [[ $# -gt 0 && $1 != --json ]]; do shift; done
  off=100; [[ $PWD == {tmp_path}/old ]] && off=80
  mode='{{"off": {{"teraedges_per_second": '$off'}}}}'
  echo '{{"results": [{{"neurons": 1024, "layers": 120, "peers": {{}}, "modes": '"$mode"'}}]}}' \
    > "$2"
  exit 0
fi
[[ "$1 $2" == "-m pip" ]] && exit 0
exec {sys.executable} "$@"
""")
    (fake / "python3").chmod(0o755)
    (tmp_path / "old" / "spdnn_mpi").mkdir(parents=True)
    (tmp_path / "old" / "spdnn_mpi" / "__init__.py").write_text("")
    out = tmp_path / "out"
    res = run("bash", str(TOOLS / "device_run.sh"), env={
        "PATH": f"{fake}:{os.environ['PATH']}", "STEPS": "challenge", "OUT": str(out),
        "BASELINE": str(tmp_path / "old"), "BASELINE_ROUNDS": "2",
        "BASELINE_ARGS": "--config 1024x120",
        "CHALLENGE_ARGS": "--config 1024x120 --peer cusparse"})
    assert res.returncode == 0, res.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == [str(tmp_path / "old"), str(TOOLS.parent)] * 2
    assert "--peer cusparse" in calls[1] and "--peer" not in calls[3]
    for name in ("bench_baseline", "bench_baseline_r2", "bench_challenge", "bench_challenge_r2"):
        assert (out / f"{name}.json").is_file(), name
    rows = [line.split() for line in res.stdout.splitlines()]
    assert ["1024x120", "off", "80.0", "100.0", "1.250", "1.250-1.250", "pass"] in rows
