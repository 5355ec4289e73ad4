#!/usr/bin/env bash
# ===========================================================================
# spdnn_mpi: Sparse DNN inference on one machine with mpiexec/mpirun, one
# MPI rank per GPU (or several CPU ranks). No Slurm needed.
#
#   SPDNN_STORE=store.h5 SPDNN_LAYERS=120 jobs/local.sh -n 4
#   SPDNN_STORE=store.h5 SPDNN_BACKEND=cpu SPDNN_RANKS=2 jobs/local.sh
#
# Usage: jobs/local.sh [-n RANKS] [-h]
#
# Parameters (environment variables; the same as jobs/slurm_infer.sbatch):
#   SPDNN_STORE        (required) the HDF5 store (`spdnn generate`/`spdnn prepare`)
#   SPDNN_RANKS        MPI ranks (also -n)    [GPUs nvidia-smi lists for the
#                      cuda/auto backends, else 1]
#   SPDNN_LAYERS       layers to run                       [all layers in the store]
#   SPDNN_BACKEND      auto | cuda | cpu | reference       [auto]
#   SPDNN_CHECK        auto | 1 | 0: pass --check; auto = when the store holds
#                      truth for that layer count                     [auto]
#   SPDNN_THREADS      CPU threads per rank               [cores / ranks]
#   SPDNN_OUTDIR       where the categories and report go  [.]
#   SPDNN_TAG          file name prefix            [spdnn-local-<date>-<time>-<pid>]
#   SPDNN_EXTRA_ARGS   more `spdnn infer` options, e.g. "--partition nnz"
#   SPDNN_QUIET        1: no per-layer progress                         [0]
#   SPDNN_PYTHON       the Python that has spdnn_mpi and mpi4py   [python3, python]
#   SPDNN_CMD          the command to run instead of "$SPDNN_PYTHON -m spdnn_mpi"
#   SPDNN_MPIEXEC      the launcher        [the first of mpiexec, mpirun in PATH]
#                      It must belong to the MPI that mpi4py was built with:
#                      with the `mpich` wheel that is the wheel's own mpiexec.
#   SPDNN_CUPY_CACHE_DIR  CuPy kernel cache (sets CUPY_CACHE_DIR)  [CuPy's default]
#
# Outputs: $SPDNN_OUTDIR/$SPDNN_TAG.categories.tsv and .report.json
# Exit status: that of `spdnn infer` (1: --check found a difference), or 2
# when a parameter is missing or wrong (reported before anything is launched).
# ===========================================================================
set -euo pipefail

fail() {
    echo "local.sh: error: $*" >&2
    exit 2
}
say() { echo "local.sh: $*"; }

RANKS=${SPDNN_RANKS:-}
while (($#)); do
    case $1 in
        -n | --ranks | -np)
            [[ $# -ge 2 ]] || fail "$1 needs a number of ranks"
            RANKS=$2; shift 2 ;;
        -n?*) RANKS=${1#-n}; shift ;;
        -h | --help) sed -n '3,/^# =====/{/^# =====/!p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown argument '$1' (parameters are environment variables; see $0 --help)" ;;
    esac
done

# ------------------------------------------------------------- parameters
STORE=${SPDNN_STORE:-}
LAYERS=${SPDNN_LAYERS:-}
BACKEND=${SPDNN_BACKEND:-auto}
CHECK=${SPDNN_CHECK:-auto}
THREADS=${SPDNN_THREADS:-}
OUTDIR=${SPDNN_OUTDIR:-.}
TAG=${SPDNN_TAG:-spdnn-local-$(date +%Y%m%d-%H%M%S)-$$}
EXTRA=${SPDNN_EXTRA_ARGS:-}
QUIET=${SPDNN_QUIET:-0}

[[ -n $STORE ]] || fail "SPDNN_STORE is not set: name the HDF5 store to run, e.g.
  SPDNN_STORE=/path/to/store.h5 SPDNN_LAYERS=120 jobs/local.sh -n 2
  (make a store with 'spdnn generate' or 'spdnn prepare')"
[[ -e $STORE ]] || fail "SPDNN_STORE=$STORE: no such file"
[[ -f $STORE && -r $STORE ]] || fail "SPDNN_STORE=$STORE: not a readable file"
if [[ -n $LAYERS && ! $LAYERS =~ ^[1-9][0-9]*$ ]]; then
    fail "SPDNN_LAYERS=$LAYERS: must be a positive number of layers"
fi
case $BACKEND in auto | cuda | cpu | reference) ;;
    *) fail "SPDNN_BACKEND=$BACKEND: must be auto, cuda, cpu or reference" ;;
esac
case ${CHECK,,} in
    auto) CHECK=auto ;; 1 | yes | true | on) CHECK=1 ;; 0 | no | false | off) CHECK=0 ;;
    *) fail "SPDNN_CHECK=$CHECK: must be auto, 1 or 0" ;;
esac
if [[ -n $THREADS && ! $THREADS =~ ^[1-9][0-9]*$ ]]; then
    fail "SPDNN_THREADS=$THREADS: must be a positive integer"
fi
[[ $TAG =~ ^[A-Za-z0-9._+-]+$ ]] || fail "SPDNN_TAG=$TAG: use letters, digits and ._+- only"
if [[ -z $RANKS ]]; then
    RANKS=1
    if [[ $BACKEND == cuda || $BACKEND == auto ]] && command -v nvidia-smi >/dev/null 2>&1; then
        gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
        if ((gpus > 0)); then RANKS=$gpus; fi
    fi
fi
[[ $RANKS =~ ^[1-9][0-9]*$ ]] || fail "number of ranks '$RANKS': must be a positive integer"

# ---------------------------------------------------------- environment
if [[ -n ${SPDNN_MPIEXEC:-} ]]; then
    read -r -a MPIEXEC <<<"$SPDNN_MPIEXEC"
    command -v "${MPIEXEC[0]}" >/dev/null 2>&1 || fail "SPDNN_MPIEXEC=$SPDNN_MPIEXEC: not found"
elif command -v mpiexec >/dev/null 2>&1; then
    MPIEXEC=(mpiexec)
elif command -v mpirun >/dev/null 2>&1; then
    MPIEXEC=(mpirun)
else
    fail "neither mpiexec nor mpirun is in PATH: install an MPI (e.g. 'pip install mpich'
  for the wheel that mpi4py can use), load your cluster's MPI module, or set SPDNN_MPIEXEC"
fi
flavour=$("${MPIEXEC[@]}" --version 2>&1 | head -n 5 || true)
LAUNCH=("${MPIEXEC[@]}" -n "$RANKS")
if grep -q HYDRA <<<"$flavour"; then
    mpi_name="MPICH hydra $(awk '/Version:/ {print $2; exit}' <<<"$flavour")"
else
    mpi_name=$(head -n 1 <<<"$flavour")
fi
if grep -qiE 'open mpi|openrte' <<<"$flavour"; then
    # Open MPI: refuses root without this, refuses more ranks than cores
    # without --oversubscribe, and binds ranks to one core unless told not to
    [[ $(id -u) -eq 0 ]] && LAUNCH+=(--allow-run-as-root)
    LAUNCH+=(--oversubscribe --bind-to none)
fi

if [[ -n ${SPDNN_CMD:-} && -z ${SPDNN_PYTHON:-} ]]; then
    PYTHON=""
    read -r -a CMD <<<"$SPDNN_CMD"
else
    PYTHON=${SPDNN_PYTHON:-$(command -v python3 || command -v python || true)}
    [[ -n $PYTHON ]] || fail "no python3 or python in PATH: set SPDNN_PYTHON"
    command -v "$PYTHON" >/dev/null 2>&1 || fail "SPDNN_PYTHON=$PYTHON: not found"
    if ! err=$("$PYTHON" -c 'import spdnn_mpi, mpi4py' 2>&1); then
        fail "$PYTHON cannot import spdnn_mpi and mpi4py (${err##*$'\n'}):
  pip install it into that Python, or set SPDNN_PYTHON / PYTHONPATH / SPDNN_CMD"
    fi
    if [[ -n ${SPDNN_CMD:-} ]]; then read -r -a CMD <<<"$SPDNN_CMD"; else CMD=("$PYTHON" -m spdnn_mpi); fi
fi

N_IMAGES="?"
if [[ -n $PYTHON ]]; then
    probe=$("$PYTHON" - "$STORE" "$LAYERS" 2>&1 <<'EOF'
import sys
from spdnn_mpi.errors import SpdnnError
from spdnn_mpi.formats.store.reader import Store
path, layers = sys.argv[1], sys.argv[2]
try:
    with Store(path) as s:
        n = int(layers) if layers else s.n_layers
        if not 1 <= n <= s.n_layers:
            raise SpdnnError(f"{path}: {n} layers asked for, the store has {s.n_layers}")
        if not s.has_inputs:
            s.n_images  # raises StoreError: no inputs, and how to add them
        print(n, s.n_images, int(s.truth(n) is not None))
except SpdnnError as exc:
    print(exc)
    sys.exit(3)
EOF
    ) || fail "$(tail -n 1 <<<"$probe")"
    read -r LAYERS_RUN N_IMAGES HAS_TRUTH <<<"$probe"
    if [[ $CHECK == auto ]]; then CHECK=$HAS_TRUTH; fi
    if [[ $CHECK == 1 && $HAS_TRUTH == 0 ]]; then
        fail "SPDNN_CHECK=1 but $STORE holds no truth for $LAYERS_RUN layers"
    fi
    LAYERS=$LAYERS_RUN
elif [[ $CHECK == auto ]]; then
    CHECK=0
    say "SPDNN_CMD given without SPDNN_PYTHON: cannot look for truth in the store, not checking"
fi

mkdir -p "$OUTDIR" 2>/dev/null || fail "SPDNN_OUTDIR=$OUTDIR: cannot create it"
[[ -w $OUTDIR ]] || fail "SPDNN_OUTDIR=$OUTDIR: not writable"
OUT="$OUTDIR/$TAG.categories.tsv"
REPORT="$OUTDIR/$TAG.report.json"
[[ -n ${SPDNN_CUPY_CACHE_DIR:-} ]] && export CUPY_CACHE_DIR=$SPDNN_CUPY_CACHE_DIR

# ---------------------------------------------------------------- launch
ARGS=(infer "$STORE" --backend "$BACKEND" --out "$OUT" --json "$REPORT")
[[ -n $LAYERS ]] && ARGS+=(--layers "$LAYERS")
[[ $CHECK == 1 ]] && ARGS+=(--check)
[[ -n $THREADS ]] && ARGS+=(--threads "$THREADS")
[[ $QUIET == 1 ]] && ARGS+=(--quiet)
if [[ -n $EXTRA ]]; then read -r -a extra_args <<<"$EXTRA"; ARGS+=("${extra_args[@]}"); fi

say "$RANKS rank(s) on $(hostname -s) with ${MPIEXEC[*]} ($mpi_name)"
say "store $STORE: $N_IMAGES images, ${LAYERS:-all} layers, backend $BACKEND, check $([[ $CHECK == 1 ]] && echo yes || echo no)"
say "categories -> $OUT"
say "report     -> $REPORT"
say "running: ${LAUNCH[*]} ${CMD[*]} ${ARGS[*]}"
start=$SECONDS
set +e
"${LAUNCH[@]}" "${CMD[@]}" "${ARGS[@]}"
rc=$?
set -e
say "exit status $rc after $((SECONDS - start)) s"
if [[ $rc -eq 0 && ! -s $REPORT ]]; then
    echo "local.sh: error: spdnn infer exited 0 but wrote no report at $REPORT" >&2
    rc=1
fi
exit "$rc"
