"""The job scripts in jobs/, run for real.

Tests marked ``slurm`` submit jobs with ``sbatch --wait`` to the single-node
cluster that ``.ci/slurm_up.sh`` starts; they are skipped unless
``SPDNN_SLURM_TESTS=1`` is set (``.ci/run`` sets it after slurm_up succeeds)
and ``sinfo`` shows an idle node. Run them in one plain pytest process, not
under mpiexec: each test submits jobs that start their own MPI ranks.

The other tests need no Slurm: they run the scripts with bash directly and
check that a missing or wrong parameter stops them early with a clear message.

Every subprocess has a timeout; a job still running when its test gives up
is cancelled by name, so no test can hang.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from spdnn_mpi.formats.store.reader import Store

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "jobs"
SBATCH_INFER = JOBS / "slurm_infer.sbatch"
SBATCH_MULTI = JOBS / "slurm_multinode.sbatch"
LOCAL = JOBS / "local.sh"

SUBMIT_TIMEOUT = 240  # seconds for one `sbatch --wait` (the jobs take ~10 s here)
SCRIPT_TIMEOUT = 60  # seconds for a script that must fail before launching anything

# variables that must not leak from the test's own process into a job or a
# launched script: a pytest run under mpiexec, or inside a Slurm allocation,
# would otherwise hand its PMI/Slurm identity to the ranks started there
_LEAKY = (
    "SLURM_",
    "SBATCH_",
    "SRUN_",
    "SALLOC_",
    "PMI_",
    "PMIX_",
    "OMPI_",
    "HYDRA_",
    "MPIR_",
    "MPIEXEC_",
    "I_MPI_",
    "SPDNN_",
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY)}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    env["SPDNN_PYTHON"] = sys.executable
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env.update(extra)
    return env


def _in_mpi_job() -> bool:
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        try:
            if int(os.environ.get(var, "1")) > 1:
                return True
        except ValueError:
            pass
    return False


def slurm_skip_reason() -> str | None:
    if os.environ.get("SPDNN_SLURM_TESTS") != "1":
        return "Slurm tests are off: run .ci/slurm_up.sh, then set SPDNN_SLURM_TESTS=1"
    if _in_mpi_job():
        return "Slurm tests submit their own MPI jobs: run them in one plain pytest process"
    for cmd in ("sbatch", "sinfo", "scancel"):
        if shutil.which(cmd) is None:
            return f"SPDNN_SLURM_TESTS=1 but {cmd} is not in PATH (did .ci/slurm_up.sh run?)"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s (is slurmctld running?)"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s in ("idle", "mixed") for s in states):
        return f"no idle Slurm node (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return None


_SKIP = slurm_skip_reason()
slurm = [pytest.mark.slurm, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


def requires_slurm(fn):
    for mark in slurm:
        fn = mark(fn)
    return fn


# -------------------------------------------------------------------- stores
def _write_random_store(
    path: Path, n_images: int = 600, width: int = 64, n_layers: int = 6, seed: int = 3
) -> None:
    """A small store with truth, written directly (no `spdnn generate` needed)."""
    from spdnn_mpi.formats.store.reader import StoreWriter
    from spdnn_mpi.model import Layer, Network, SparseRows
    from spdnn_mpi.reference import reference_categories

    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(n_layers):
        i, j = np.nonzero(rng.random((width, width)) < 0.12)
        layers.append(
            Layer.from_coo(i, j, np.full(len(i), 0.3), width, width, bias=-0.1, clip=32.0)
        )
    net = Network(layers)
    rows = SparseRows.from_dense((rng.random((n_images, width)) < 0.25).astype(np.float32))
    with StoreWriter(path) as w:
        for layer in layers:
            w.add_layer(layer)
        w.write_inputs(rows)
        w.add_truth(n_layers, reference_categories(net, rows), "reference")


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "small.h5"
    _write_random_store(path)
    return path


@pytest.fixture(scope="module")
def generated_store(tmp_path_factory) -> Path:
    """`spdnn generate --neurons 1024 --layers 12 --images 2000 --seed 1` (or a random store)."""
    path = tmp_path_factory.mktemp("gen") / "store.h5"
    if importlib.util.find_spec("spdnn_mpi.commands.generate") is None:
        _write_random_store(path)
        return path
    cmd = [
        sys.executable,
        "-m",
        "spdnn_mpi",
        "generate",
        "--neurons",
        "1024",
        "--layers",
        "12",
        "--images",
        "2000",
        "--seed",
        "1",
        "--out",
        str(path),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env())
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}"
    return path


def expected_categories(store_path: Path) -> tuple[int, np.ndarray]:
    """(layers, sorted 1-based ids) from the store's truth (computed if absent)."""
    with Store(store_path) as s:
        n = s.n_layers
        truth = s.truth(n)
        if truth is None:
            from spdnn_mpi.reference import reference_categories

            truth = reference_categories(s.network(n), s.inputs())
    return n, np.sort(np.asarray(truth, dtype=np.int64))


def read_categories(path: Path) -> np.ndarray:
    return np.array([int(x) for x in path.read_text().split()], dtype=np.int64)


# ------------------------------------------------------------------- sbatch
def sbatch_wait(
    script: Path,
    workdir: Path,
    sbatch_args: list[str],
    env: dict[str, str],
    timeout: float = SUBMIT_TIMEOUT,
) -> tuple[int, str, str, str]:
    """Submit with `sbatch --wait --parsable` from ``workdir``: (exit, job id, log, job name).

    The job gets a unique name; if it outlives ``timeout`` it is cancelled.
    """
    name = f"spdnn-test-{uuid.uuid4().hex[:8]}"
    cmd = [
        "sbatch",
        "--wait",
        "--parsable",
        f"--job-name={name}",
        "--output=%x-%j.out",
        "--time=5",
        *sbatch_args,
        str(script),
    ]
    try:
        res = subprocess.run(
            cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", f"--name={name}"], timeout=30, check=False)
        pytest.fail(f"job {name} did not finish within {timeout} s; cancelled")
    job_id = res.stdout.strip().split(";")[0].splitlines()[0] if res.stdout.strip() else ""
    logs = sorted(workdir.glob(f"{name}-{job_id}.out")) if job_id else []
    log = logs[0].read_text() if logs else ""
    if not job_id:
        pytest.fail(f"sbatch refused the job (exit {res.returncode}): {res.stderr.strip()}")
    return res.returncode, job_id, log, name


# ------------------------------------------------------------ Slurm tests
HELLO = """\
#!/bin/bash
set -euo pipefail
srun --mpi=pmi2 "$SPDNN_PYTHON" -c '
from mpi4py import MPI
c = MPI.COMM_WORLD
total = c.allreduce(c.Get_rank() + 1)
local = c.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
print("hello", c.Get_rank(), c.Get_size(), total, local, flush=True)
'
"""


@requires_slurm
def test_srun_pmi2_gives_mpi4py_real_ranks(tmp_path):
    """srun --mpi=pmi2 + the mpich wheel: 3 ranks 0..2 of one world, not 3 rank-0 copies."""
    script = tmp_path / "hello.sbatch"
    script.write_text(HELLO)
    rc, job, log, _ = sbatch_wait(script, tmp_path, ["--ntasks=3"], clean_env())
    assert rc == 0, log
    rows = sorted(
        tuple(map(int, line.split()[1:])) for line in log.splitlines() if line.startswith("hello ")
    )
    assert rows == [(r, 3, 6, 3) for r in range(3)], log


@requires_slurm
@pytest.mark.parametrize("ntasks", [2, 3])
def test_infer_job_cpu_backend(tmp_path, generated_store, ntasks):
    """The generic script, CPU backend, several tasks, GPU request overridden."""
    layers, truth = expected_categories(generated_store)
    env = clean_env(
        SPDNN_STORE=str(generated_store),
        SPDNN_LAYERS=str(layers),
        SPDNN_BACKEND="cpu",
        SPDNN_QUIET="1",
    )
    rc, job, log, name = sbatch_wait(
        SBATCH_INFER, tmp_path, [f"--ntasks-per-node={ntasks}", "--gpus-per-task=0"], env
    )
    assert rc == 0, log
    out = tmp_path / f"{name}-{job}.categories.tsv"
    report_path = tmp_path / f"{name}-{job}.report.json"
    assert out.is_file() and report_path.is_file(), f"{sorted(tmp_path.iterdir())}\n{log}"
    np.testing.assert_array_equal(read_categories(out), truth)
    report = json.loads(report_path.read_text())
    assert report["ranks"] == ntasks
    assert report["categories_count"] == len(truth)
    assert report["check"]["passed"] is True  # truth present: the script added --check
    assert report["edges_per_second"] > 0
    assert f"{ntasks} task(s)" in log and "--mpi=pmi2" in log and "--check" in log


@requires_slurm
def test_multinode_script_on_one_node_stages_store(tmp_path, small_store):
    """The multi-node example with its resources overridden down to this one node."""
    layers, truth = expected_categories(small_store)
    stage = tmp_path / "node-local"
    stage.mkdir()
    env = clean_env(
        SPDNN_STORE=str(small_store),
        SPDNN_BACKEND="cpu",
        SPDNN_QUIET="1",
        SPDNN_STAGE_DIR=str(stage),
    )
    rc, job, log, name = sbatch_wait(
        SBATCH_MULTI,
        tmp_path,
        ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-task=0", "--cpus-per-task=1"],
        env,
    )
    assert rc == 0, log
    assert f"store {stage}/spdnn-{job}-small.h5:" in log  # the ranks read the staged copy
    np.testing.assert_array_equal(read_categories(tmp_path / f"{name}-{job}.categories.tsv"), truth)
    report = json.loads((tmp_path / f"{name}-{job}.report.json").read_text())
    assert report["ranks"] == 2 and report["check"]["passed"] is True
    assert not list(stage.iterdir()), "staged copy left behind"


@requires_slurm
def test_infer_job_missing_store_fails_early(tmp_path):
    env = clean_env(SPDNN_STORE=str(tmp_path / "nope.h5"), SPDNN_BACKEND="cpu")
    rc, job, log, _ = sbatch_wait(
        SBATCH_INFER, tmp_path, ["--ntasks-per-node=2", "--gpus-per-task=0"], env, timeout=120
    )
    assert rc != 0
    assert "nope.h5: no such file" in log
    assert "running:" not in log  # nothing was launched


def cluster_gpus() -> int:
    """GPUs per node the cluster advertises (`sinfo %G`, e.g. gpu:4), 0 if none."""
    gres = subprocess.run(
        ["sinfo", "-h", "-o", "%G"], capture_output=True, text=True, timeout=15
    ).stdout
    counts = [int(m) for m in re.findall(r"gpu(?::[A-Za-z0-9_-]+)?:(\d+)", gres)]
    return max(counts, default=0)


PROBE = """\
#!/bin/bash
# stands in for `python -m spdnn_mpi`: shows what each task was given, then runs it
echo "probe rank=${PMI_RANK:-?} slurm_procid=${SLURM_PROCID:-?} cvd=${CUDA_VISIBLE_DEVICES:-none}"
exec "$SPDNN_PYTHON" -m spdnn_mpi "$@"
"""


@requires_slurm
def test_default_gpu_directives_bind_one_gpu_per_task(tmp_path, generated_store):
    """The script as written (4 tasks, --gpus-per-task=1): each rank gets its own GPU.

    Needs GPUs in the cluster: .ci/slurm_up.sh gives the node fake ones with
    SPDNN_SLURM_FAKE_GPUS=4 (character devices, nothing behind them), so the
    Slurm side (request, per-task CUDA_VISIBLE_DEVICES) is real and the
    inference itself runs on the CPU backend.
    """
    if cluster_gpus() < 4:
        pytest.skip("the cluster has fewer than 4 GPUs (slurm_up.sh with SPDNN_SLURM_FAKE_GPUS=4)")
    layers, truth = expected_categories(generated_store)
    probe = tmp_path / "probe.sh"
    probe.write_text(PROBE)
    env = clean_env(
        SPDNN_STORE=str(generated_store),
        SPDNN_BACKEND="cpu",
        SPDNN_QUIET="1",
        SPDNN_CMD=f"bash {probe}",
    )
    rc, job, log, name = sbatch_wait(SBATCH_INFER, tmp_path, [], env)
    assert rc == 0, log
    seen = dict(re.findall(r"^probe rank=\S+ slurm_procid=(\d+) cvd=(\S+)$", log, re.M))
    assert sorted(seen) == ["0", "1", "2", "3"], log
    assert sorted(seen.values()) == ["0", "1", "2", "3"], log  # one distinct GPU each
    np.testing.assert_array_equal(read_categories(tmp_path / f"{name}-{job}.categories.tsv"), truth)
    report = json.loads((tmp_path / f"{name}-{job}.report.json").read_text())
    assert report["ranks"] == 4 and report["check"]["passed"] is True


@requires_slurm
def test_gpu_request_must_be_overridden_without_gpus(tmp_path, small_store):
    """The #SBATCH --gpus-per-task=1 line is rejected by a cluster without GPUs, at submit."""
    if cluster_gpus() > 0:
        pytest.skip("this cluster has GPUs (real or fake)")
    env = clean_env(SPDNN_STORE=str(small_store), SPDNN_BACKEND="cpu")
    res = subprocess.run(
        ["sbatch", "--parsable", "--ntasks-per-node=2", str(SBATCH_INFER)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if res.returncode == 0:  # should not happen; do not leave it queued
        subprocess.run(["scancel", res.stdout.strip().split(";")[0]], timeout=30)
    assert res.returncode != 0
    assert "gres" in res.stderr.lower()


# -------------------------------------------------------- no Slurm needed
def run_script(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("script", [SBATCH_INFER, SBATCH_MULTI, LOCAL], ids=lambda p: p.name)
def test_missing_store_parameter_fails_early(script):
    res = run_script(script, clean_env())
    assert res.returncode == 2, res.stdout + res.stderr
    assert "SPDNN_STORE is not set" in res.stderr
    assert "running:" not in res.stdout


@pytest.mark.parametrize("script", [SBATCH_INFER, LOCAL], ids=lambda p: p.name)
@pytest.mark.parametrize(
    "params, message",
    [
        ({"SPDNN_STORE": "/nonexistent/store.h5"}, "no such file"),
        ({"SPDNN_LAYERS": "ten"}, "SPDNN_LAYERS=ten: must be a positive number"),
        ({"SPDNN_LAYERS": "7"}, "7 layers asked for, the store has 6"),
        ({"SPDNN_BACKEND": "gpu"}, "SPDNN_BACKEND=gpu: must be"),
        ({"SPDNN_CHECK": "maybe"}, "SPDNN_CHECK=maybe: must be"),
    ],
)
def test_bad_parameter_fails_early(script, small_store, params, message):
    if script == SBATCH_INFER and "SPDNN_LAYERS" in params and params["SPDNN_LAYERS"] == "7":
        # the store is probed only inside a job; outside, the Slurm check stops first
        params = {**params, "SLURM_JOB_ID": "0", "SPDNN_LAUNCHER": "mpiexec"}
    env = clean_env(**{"SPDNN_STORE": str(small_store), **params})
    res = run_script(script, env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr
    assert "running:" not in res.stdout


def test_sbatch_script_outside_slurm_says_so(small_store):
    res = run_script(SBATCH_INFER, clean_env(SPDNN_STORE=str(small_store)))
    assert res.returncode == 2
    assert "not inside a Slurm job" in res.stderr and "jobs/local.sh" in res.stderr
    assert_both_submit_forms(res.stderr)


def assert_both_submit_forms(text: str) -> None:
    """The GPU form and the CPU form (a cluster without GPUs rejects the first one)."""
    text = " ".join(text.replace("\\\n", " ").split())
    assert "sbatch --export=ALL,SPDNN_STORE=/path/to/store.h5 jobs/slurm_infer.sbatch" in text
    assert ("sbatch --gpus-per-task=0 --export=ALL,SPDNN_STORE=/path/to/store.h5,"
            "SPDNN_BACKEND=cpu jobs/slurm_infer.sbatch") in text
    assert "Invalid generic resource (gres) specification" in text


def test_sbatch_script_without_store_shows_both_submit_forms():
    res = run_script(SBATCH_INFER, clean_env())
    assert res.returncode == 2
    assert_both_submit_forms(res.stderr)


def test_cuda_backend_in_a_job_without_gpus_says_which_form(small_store):
    env = clean_env(SPDNN_STORE=str(small_store), SPDNN_BACKEND="cuda", SLURM_JOB_ID="7")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = run_script(SBATCH_INFER, env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "SPDNN_BACKEND=cuda but job 7 holds no GPUs" in res.stderr
    assert_both_submit_forms(res.stderr)
    assert "running:" not in res.stdout


def test_local_sh_bad_rank_count(small_store):
    res = run_script(LOCAL, clean_env(SPDNN_STORE=str(small_store)), "-n", "zero")
    assert res.returncode == 2 and "must be a positive integer" in res.stderr


@pytest.mark.skipif(_in_mpi_job(), reason="launches its own mpiexec")
@pytest.mark.skipif(
    shutil.which("mpiexec") is None and shutil.which("mpirun") is None,
    reason="no mpiexec/mpirun in PATH",
)
def test_local_sh_two_ranks(tmp_path, small_store):
    layers, truth = expected_categories(small_store)
    env = clean_env(
        SPDNN_STORE=str(small_store),
        SPDNN_BACKEND="cpu",
        SPDNN_OUTDIR=str(tmp_path),
        SPDNN_TAG="run",
        SPDNN_QUIET="1",
    )
    res = subprocess.run(
        ["bash", str(LOCAL), "-n", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    np.testing.assert_array_equal(read_categories(tmp_path / "run.categories.tsv"), truth)
    report = json.loads((tmp_path / "run.report.json").read_text())
    assert report["ranks"] == 2 and report["check"]["passed"] is True
