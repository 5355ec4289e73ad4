#!/usr/bin/env bash
# The whole test suite: the MPI tests under 1, 2 and 3 ranks, then every other test.
# GPU tests skip with a reason where there is no GPU; Slurm tests run only when
# SPDNN_SLURM_TESTS=1 (set by .ci/run after it starts a local Slurm cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MPIEXEC=${MPIEXEC:-mpiexec}
# each rank's lines tagged with its rank, so summaries of ranks do not run into one line
tag=-prepend-rank  # MPICH's hydra
if "$MPIEXEC" --version 2>&1 | grep -q "Open MPI"; then tag=--tag-output; fi
for n in 1 2 3; do
    echo "== MPI tests on $n rank(s)"
    timeout 600 "$MPIEXEC" "$tag" -n "$n" "$PY" -m pytest -q --with-mpi -p no:cacheprovider \
        tests/test_mpi.py tests/test_cli_mpi.py tests/test_models_mpi.py -m mpi 2>&1 |
        grep -E "passed|failed|error|FAILED|Error" | sed -E "s/(\[[0-9]+\] ?)+$//" | sort
done
echo "== serial tests"
# the mpi-marked tests ran above under mpiexec; here everything else
exec "$PY" -m pytest -q -rs --durations=10 -m "not mpi" "$@"
