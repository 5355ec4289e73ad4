#!/usr/bin/env bash
# Compile every CUDA kernel source in cuda/ with the local nvcc for sm_80 and
# sm_90, with the template instantiations the backend asks NVRTC for, so a
# kernel that does not compile fails CI. No GPU needed.
#
# The SPDNN_* settings come from the backend itself (the #define block of
# KernelConfig in spdnn_mpi/backends/cuda/config.py, printed by Python): the
# defaults, then once more with the other forms the GPU tests compile.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
nvcc_bin="${NVCC:-nvcc}"
python_bin="${PYTHON:-python3}"
if ! command -v "$nvcc_bin" >/dev/null 2>&1; then
  echo "compile_kernels: nvcc not found (set NVCC or install the CUDA toolkit)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
config_block() {  # the #define block of KernelConfig() with these field overrides
  PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$python_bin" -c '
import sys
from spdnn_mpi.backends.cuda.config import KernelConfig
fields = dict((k, int(v)) for k, v in (a.split("=") for a in sys.argv[1:]))
sys.stdout.write(KernelConfig().with_overrides(**fields).define_block())' "$@"
}
config_block > "$work/defaults.h"
# the forms the GPU tests compile beside the defaults
others="csr4_group=1 group_lane_slots=16 group_min_blocks=2"
# shellcheck disable=SC2086
config_block $others > "$work/others.h"
# One unit that instantiates every kernel template the backend uses.
{
  for f in "$root"/cuda/*.cu; do echo "#include \"$(basename "$f")\""; done
  echo '#define P const i64*, int, int, float, float, const float*, float, float, int*, int*, u64*, int, int'
  for d in 8 16 32 64; do for form in "32,false" "32,true" "16,true" "8,true"; do
    echo "template __global__ void layer_ell_smem<$d,$form>(P, const u16*, const int*);"
    echo "template __global__ void layer_ell_global<$d,$form>(P, const u16*, const int*);"
  done; done
  for d in 8 16 32 64; do
    for kern in layer_group layer_group_sum; do
      echo "template __global__ void $kern<$d>(P, int, const u16*, const int*, const float*, int, int);"
    done
  done
  for d in 8 16 32 64; do
    echo "template __global__ void layers_held_grid<$d>(const i64*, const HeldLayer*, int, int, int, int*, int*, u64*);"
    echo "template __global__ void layers_held_flow<$d>(const i64*, const HeldLayer*, int, int, int, int*, int*, u64*, u64*, int, u32*);"
    echo "template __global__ void layers_held_row<$d>(const i64*, const HeldLayer*, int, int, int, int*, int*, u64*, u32*);"
    echo "template __global__ void layers_run_grid<$d>(const i64*, const HeldLayer*, int, int, int, int*, int*, u64*);"
  done
  for smem in true false; do for vals in true false; do
    echo "template __global__ void layer_csr4<$smem,$vals>(P, const int2*, const u16*, const float*);"
  done; done
  for smem in true false; do for vals in true false; do for it in u16 int; do
    echo "template __global__ void layer_csr<$smem,$vals,$it>(P, const int*, const $it*, const float*);"
  done; done; done
  echo "template __global__ void whole_network<8>(const i64*, const WholeLayer*, int, int, int*, int*, u64*, int*);"
  for it in u16 int; do
    echo "template __global__ void scatter_rows<$it>(float*, i64, const int*, int, const i64*, const $it*, const float*, int*);"
    echo "template __global__ void scatter_bits<$it>(u32*, i64, const int*, int, const i64*, const $it*, int*);"
  done
} > "$work/instances.cu"
status=0
compile() {  # arch, settings header, source, label
  if "$nvcc_bin" -arch="$1" -std=c++17 -I"$root/cuda" -Werror all-warnings \
      -include "$2" -c "$3" -o "$work/out.o" 2>"$work/log"; then
    echo "ok   $1 $4"
  else
    echo "FAIL $1 $4"; cat "$work/log"; status=1
  fi
}
for arch in sm_80 sm_90; do
  for src in "$root"/cuda/*.cu "$work/instances.cu"; do
    compile "$arch" "$work/defaults.h" "$src" "$(basename "$src")"
  done
  compile "$arch" "$work/others.h" "$work/instances.cu" "instances.cu ($others)"
done
exit $status
