"""A plain `pip install` with no MPI library: one process runs, a launched one says what to do.

The machine without MPI is simulated by an ``mpi4py`` on PYTHONPATH whose
``MPI`` module fails the way the real one does there (mpi4py 4 raises
RuntimeError "cannot load MPI library"; older builds an ImportError naming
libmpi.so.40), in a subprocess with no launcher variables.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import write_random_store

from spdnn_mpi.comm import LAUNCHER_VARIABLES, launched_processes, launched_rank

FAILURES = {
    "runtime": 'raise RuntimeError("cannot load MPI library")',
    "import": 'raise ImportError("libmpi.so.40: cannot open shared object file: '
              'No such file or directory")',
}
LAUNCHER_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_", "HYDRA_", "I_MPI_", "MV2_",
                     "JSM_", "FLUX_", "PALS_", "ALPS_")


def no_mpi_env(tmp_path, failure: str = "runtime", **extra: str) -> dict:
    fake = tmp_path / "no-mpi"
    (fake / "mpi4py").mkdir(parents=True, exist_ok=True)
    (fake / "mpi4py" / "__init__.py").write_text("")
    (fake / "mpi4py" / "MPI.py").write_text(FAILURES[failure] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), *sys.path])
    env.update(extra)
    return env


def spdnn(env: dict, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spdnn_mpi", *argv], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s.h5"
    write_random_store(path, n_images=200, n_layers=3)
    return path


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_one_process_needs_no_mpi(tmp_path, store, failure):
    env = no_mpi_env(tmp_path, failure)
    probe = subprocess.run([sys.executable, "-c", "from mpi4py import MPI"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0  # the simulated machine really has no MPI
    proc = spdnn(env, "infer", str(store), "--backend", "cpu", "--check", "--quiet",
                 "--out", str(tmp_path / "c.tsv"), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    assert "check       PASSED" in proc.stdout and "1 rank(s)" in proc.stdout
    assert (tmp_path / "c.tsv").exists() and (tmp_path / "r.json").exists()


def test_demo_runs_without_mpi(tmp_path):
    env = no_mpi_env(tmp_path)
    proc = spdnn(env, "demo", "--images", "200", "--cache-dir", str(tmp_path / "cache"),
                 "--backend", "cpu", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "check       PASSED" in proc.stdout


@pytest.mark.parametrize("launcher", [
    {"PMI_SIZE": "2", "PMI_RANK": "0"},
    {"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "1"},
    {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"},
    {"PMIX_RANK": "0"},
    {"FLUX_JOB_SIZE": "2", "FLUX_TASK_RANK": "1"},
    {"ALPS_APP_PE": "0"},
])
def test_launched_process_without_mpi_says_how_to_get_one(tmp_path, store, launcher):
    proc = spdnn(no_mpi_env(tmp_path, **launcher), "infer", str(store), "--quiet")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "started by an MPI launcher" in lines[0] and "no MPI library can be loaded" in lines[0]
    assert "pip install 'spdnn_mpi[mpich]'" in lines[0]
    assert "pip install --no-binary mpi4py mpi4py" in lines[0]


@pytest.mark.parametrize("alone", [
    {"OMPI_COMM_WORLD_SIZE": "1"},  # mpiexec -n 1
    {"SLURM_NTASKS": "4", "SLURM_PROCID": "0"},  # the batch script itself, not an srun step
])
def test_a_lone_process_under_a_scheduler_runs_without_mpi(tmp_path, store, alone):
    proc = spdnn(no_mpi_env(tmp_path, **alone), "infer", str(store), "--check", "--quiet")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("alone", [{}, {"OMPI_COMM_WORLD_SIZE": "1"}])
def test_a_lone_process_does_not_load_mpi(tmp_path, alone):
    """Even where MPI is installed: its start and finalize would cost every run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    code = ("import sys; from spdnn_mpi.comm import world; c = world(); "
            "print(type(c).__name__, c.Get_size(), 'mpi4py.MPI' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], env={**env, **alone},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["SelfComm", "1", "False"]


def test_launcher_detection():
    assert launched_processes({}) is None
    assert launched_processes({"PMI_SIZE": "8"}) == ("PMI_SIZE", 8)
    assert launched_processes({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}) is None
    assert launched_processes({"PMIX_RANK": "3"}) == ("PMIX_RANK", None)
    assert {name for name, _ in LAUNCHER_VARIABLES} >= {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                                        "SLURM_STEP_NUM_TASKS"}
    assert launched_processes({"MV2_COMM_WORLD_SIZE": "6"}) == ("MV2_COMM_WORLD_SIZE", 6)
    assert launched_processes({"JSM_NAMESPACE_SIZE": "2"}) == ("JSM_NAMESPACE_SIZE", 2)
    assert launched_processes({"PALS_RANKID": "5"}) == ("PALS_RANKID", None)
    assert launched_rank({"FLUX_JOB_SIZE": "4", "FLUX_TASK_RANK": "3"}) == "rank 3 of 4: "
