// The grouped kernel's layout built on the device (spdnn_mpi/backends/cuda/grouping.py):
// the outputs of fixed-degree layers grouped by identical input sets, the groups of
// layout.group_layouts (the host reference). Our own kernels and CuPy's precompiled
// sort only, so a first run compiles nothing more for the layout.
//
// The layers' rows are stacked: row r = layer * n_out + output, d 16-bit inputs each
// (sorted, d a multiple of 8). A layer's outputs are walked in the order of their keys
// (sorted per layer on the host side); equal input sets are neighbours there.
#include "spdnn_common.cuh"

#define GL_SLOTS 16                          // layout.GROUP_SLOTS
#define GL_HASH_MUL 0x9E3779B97F4A7C15ull    // layout._HASH_MUL
#define GL_WALK_THREADS 512                  // grouping.WALK_THREADS

// One thread a row: key = first input << 48 | hash of the row >> 16, as the host's.
extern "C" __global__ void __launch_bounds__(256)
    group_keys(const u64* __restrict__ words, i64 n_rows, int row_words, u64* keys) {
  for (i64 r = blockIdx.x * (i64)blockDim.x + threadIdx.x; r < n_rows;
       r += (i64)gridDim.x * blockDim.x) {
    const u64* w = words + r * row_words;
    u64 h = 0;
    for (int c = 0; c < row_words; ++c) h = (h ^ w[c]) * GL_HASH_MUL;
    keys[r] = ((w[0] & 0xFFFFull) << 48) | (h >> 16);
  }
}

__device__ __forceinline__ bool rows_differ(const u64* a, const u64* b, int row_words) {
  for (int c = 0; c < row_words; ++c)
    if (a[c] != b[c]) return true;
  return false;
}

// One block a layer, its outputs in key order a chunk of GL_WALK_THREADS at a time:
// an output starts a run where its inputs differ from the previous one's; its slot is
// its place in the run modulo GL_SLOTS; it opens a group where it starts a run or its
// slot is 0. FILL false: used[layer] = groups opened. FILL true: each output into its
// group's slot, each opened group's inputs, and (vals != null) the weights by slot.
template <bool FILL>
__device__ void group_walk(const u16* __restrict__ rows, const i64* __restrict__ order,
                           int n_out, int d, int* used, const i64* __restrict__ first_group,
                           int* out_ids, u16* indices, const float* __restrict__ vals,
                           float* weights) {
  __shared__ int sh[32];
  __shared__ int carry[2];  // last run start, groups opened so far
  const int layer = blockIdx.x, row_words = d / 4;
  const i64 base = (i64)layer * n_out;
  const u64* words = reinterpret_cast<const u64*>(rows);
  if (threadIdx.x == 0) carry[0] = carry[1] = 0;
  __syncthreads();
  for (int c0 = 0; c0 < n_out; c0 += GL_WALK_THREADS) {
    const int p = c0 + threadIdx.x;
    const bool valid = p < n_out;
    int out = 0;
    bool start = false;
    if (valid) {
      out = (int)order[base + p];
      start = p == 0 || rows_differ(words + (base + out) * row_words,
                                    words + (base + order[base + p - 1]) * row_words,
                                    row_words);
    }
    const int run = max(block_scan<true>(start ? p : -1, sh), carry[0]);
    const int slot = (p - run) % GL_SLOTS;
    const bool opens = valid && (start || slot == 0);
    const int opened = block_scan<false>(opens ? 1 : 0, sh) + carry[1];  // through p
    if (FILL && valid) {
      const i64 g = first_group[layer] + opened - 1;
      out_ids[g * GL_SLOTS + slot] = out;
      const u16* row = rows + (base + out) * d;
      if (opens)
        for (int k = 0; k < d; ++k) indices[g * d + k] = row[k];
      if (vals != nullptr)
        for (int k = 0; k < d; ++k)
          weights[(g * d + k) * GL_SLOTS + slot] = vals[(base + out) * d + k];
    }
    __syncthreads();  // every thread has read carry
    if (threadIdx.x == GL_WALK_THREADS - 1) {
      carry[0] = run;
      carry[1] = opened;
    }
    __syncthreads();
  }
  if (!FILL && threadIdx.x == 0) used[layer] = carry[1];
}

extern "C" __global__ void __launch_bounds__(GL_WALK_THREADS)
    group_count(const u16* rows, const i64* order, int n_out, int d, int* used) {
  group_walk<false>(rows, order, n_out, d, used, nullptr, nullptr, nullptr, nullptr, nullptr);
}

extern "C" __global__ void __launch_bounds__(GL_WALK_THREADS)
    group_fill(const u16* rows, const i64* order, int n_out, int d, const i64* first_group,
               int* out_ids, u16* indices, const float* vals, float* weights) {
  group_walk<true>(rows, order, n_out, d, nullptr, first_group, out_ids, indices, vals,
                   weights);
}
