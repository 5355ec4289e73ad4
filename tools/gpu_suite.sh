#!/usr/bin/env bash
# The one script to run on the device machine in ONE call (see
# /work/.library/device/README.md): GPU tests first, then the CUDA backend and
# the GPU peers timed over a few configurations, with a short table last.
#
#   tools/gpu_suite.sh                 # default configurations
#   SUITE_ARGS="--config 1024x120 --variant auto" tools/gpu_suite.sh
#   SKIP_TESTS=1 tools/gpu_suite.sh    # timings only
#
# Data: SPDNN_CHALLENGE_DIR (official 1024 network, gz TSV) and SPDNN_DIGITS
# (.npy of 28x28 digits) are used when set; .bench/cuda_suite/ is the carried
# default (copy ../shared/graphchallenge and the digits there, carry it).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-/tmp/spdnn_gpu_suite}"
mkdir -p "$out"
data="$root/.bench/cuda_suite"
if [ -z "${SPDNN_CHALLENGE_DIR:-}" ] && [ -d "$data/graphchallenge" ]; then
  export SPDNN_CHALLENGE_DIR="$data/graphchallenge"
fi
digits="${SPDNN_DIGITS:-$data/digits.npy}"
digits_arg=()
[ -f "$digits" ] && digits_arg=(--digits "$digits")

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv \
  2>&1 | tee "$out/gpu.txt"
python3 -c 'import sys; from spdnn_mpi.backends.cuda import import_cupy; print("python", sys.version.split()[0], "cupy", import_cupy().__version__)'

test_rc=0
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/pytest.log"
  test_rc=${PIPESTATUS[0]}
fi

# shellcheck disable=SC2086
default_args="--config 1024x120 --config 1024x1920 --config 4096x480 --config 4096x1920 --config 16384x480
  --config 65536x120 --peer cusparse --peer torch --peer-max 1966080 --repeat 3"
python3 -m spdnn_mpi.peers_gpu ${SUITE_ARGS:-$default_args} "${digits_arg[@]}" \
  --json "$out/suite.json" 2>&1 | tee "$out/suite.log"
suite_rc=${PIPESTATUS[0]}
echo "pytest rc=$test_rc suite rc=$suite_rc"
[ "$test_rc" -eq 0 ] && [ "$suite_rc" -eq 0 ]
