#!/usr/bin/env bash
# Compile every CUDA kernel source in cuda/ with the local nvcc for sm_80 and
# sm_90, with the template instantiations the backend asks NVRTC for, so a
# kernel that does not compile fails CI. No GPU needed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
nvcc_bin="${NVCC:-nvcc}"
if ! command -v "$nvcc_bin" >/dev/null 2>&1; then
  echo "compile_kernels: nvcc not found (set NVCC or install the CUDA toolkit)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
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
  for smem in true false; do for vals in true false; do
    echo "template __global__ void layer_csr4<$smem,$vals>(P, const int2*, const u16*, const float*);"
  done; done
  for smem in true false; do for vals in true false; do for it in u16 int; do
    echo "template __global__ void layer_csr<$smem,$vals,$it>(P, const int*, const $it*, const float*);"
  done; done; done
  for it in u16 int; do
    echo "template __global__ void scatter_rows<$it>(float*, i64, const int*, int, const i64*, const $it*, const float*, int*);"
  done
} > "$work/instances.cu"
status=0
knobs="-DSPDNN_CSR4_GROUP=1"
for arch in sm_80 sm_90; do
  for src in "$root"/cuda/*.cu "$work/instances.cu"; do
    if "$nvcc_bin" -arch="$arch" -std=c++17 -I"$root/cuda" -Werror all-warnings \
        -c "$src" -o "$work/out.o" 2>"$work/log"; then
      echo "ok   $arch $(basename "$src")"
    else
      echo "FAIL $arch $(basename "$src")"; cat "$work/log"; status=1
    fi
  done
  # the knob-selected forms the defaults leave out
  if "$nvcc_bin" -arch="$arch" -std=c++17 -I"$root/cuda" -Werror all-warnings \
      $knobs -c "$work/instances.cu" -o "$work/out.o" 2>"$work/log"; then
    echo "ok   $arch instances.cu ($knobs)"
  else
    echo "FAIL $arch instances.cu ($knobs)"; cat "$work/log"; status=1
  fi
done
exit $status
