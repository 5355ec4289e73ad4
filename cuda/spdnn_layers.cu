// One fused pass per layer: gather the inputs of each output neuron, sum,
// scale (uniform weights) or multiply-add (general weights), add the bias,
// ReLU, clip, write the output once and mark the rows still alive.  The last
// block to finish runs the plan (spdnn_common.cuh), so the layer loop never
// returns to the host.
//
// Kernels (all persistent: the grid is fixed at launch, the work comes from
// the device state, blocks past the live work exit at once):
//   layer_ell_smem<T, D>   uniform weights, D inputs per output; a block
//                          stages T rows x n_in inputs in shared memory.
//                          T = 32: lane = row; T < 32: 32/T outputs per warp.
//   layer_ell_global<D>    same, inputs read through L1/L2 (large n_in).
//   layer_ell_l1<D>        same items, scheduled per SM so a tile stays in L1.
//   layer_csr<SMEM, VALS, I>  any CSR: variable degree, per-nonzero values,
//                          32-bit indices when n_in > 65536.
// Sums run in CSR order with one accumulator, as the scipy reference does,
// so a uniform power-of-two weight reproduces the reference bit for bit.
#include "spdnn_common.cuh"

struct LayerArgs {
  float* buf0;
  float* buf1;
  i64 tstride;  // floats per tile (width * 32)
  int n_in;
  int n_out;
  float scale;  // uniform weight (1 when values are given)
  float bias_s;  // scalar bias, used when bias_v is null
  const float* bias_v;
  float clip;  // +inf for none
  int* state;
  u32* masks;  // two parities of max_tiles words
  int max_tiles;
  int* tile_base;
  int* live_hist;
  u64* stamps;
  int k;
  int drop_dead;
  u32* counters;  // two parities of nq work counters
  int nq;
};

// Kernel parameters are passed flat (no struct crosses the host boundary) and
// gathered into LayerArgs inside the kernel.
#define LAYER_PARAMS                                                                     \
  const i64 *ptrs, int n_in, int n_out, float scale, float bias_s, const float *bias_v,    \
      float clip, int *state, int *live_hist, u64 *stamps, int k, int drop_dead
#define LAYER_ARGS                                                                   \
  const LayerArgs a = {reinterpret_cast<float*>(ptrs[P_BUF0]),                       \
                       reinterpret_cast<float*>(ptrs[P_BUF1]),                       \
                       ptrs[P_TSTRIDE],                                              \
                       n_in,                                                         \
                       n_out,                                                        \
                       scale,                                                        \
                       bias_s,                                                       \
                       bias_v,                                                       \
                       clip,                                                         \
                       state,                                                        \
                       reinterpret_cast<u32*>(ptrs[P_MASKS]),                        \
                       (int)ptrs[P_MAX_TILES],                                       \
                       reinterpret_cast<int*>(ptrs[P_TILE_BASE]),                    \
                       live_hist,                                                    \
                       stamps,                                                       \
                       k,                                                            \
                       drop_dead,                                                    \
                       reinterpret_cast<u32*>(ptrs[P_COUNTERS]),                     \
                       (int)ptrs[P_NQ]}

__device__ __forceinline__ float epilogue(float acc, int j, const LayerArgs& a) {
  const float b = a.bias_v ? __ldg(a.bias_v + j) : a.bias_s;
  return fminf(fmaxf(fmaf(acc, a.scale, b), 0.0f), a.clip);
}

__device__ __forceinline__ void finish_layer(const LayerArgs& a) {
  if (last_block_done(a.state)) {
    u32* mask = a.masks + (a.k & 1) * a.max_tiles;
    u32* next = a.masks + ((a.k + 1) & 1) * a.max_tiles;
    block_plan(a.state, mask, next, a.tile_base, a.live_hist, a.stamps, a.k, a.drop_dead,
               a.counters + ((a.k + 1) & 1) * a.nq, a.nq);
  }
}

// Sum of D gathered inputs: idx points at this output's first uint4 of
// indices, consecutive uint4 are `qstride` uint4 apart (sliced layout).
template <int D>
__device__ __forceinline__ float gather_sum_smem(const uint4* __restrict__ ip, int qstride,
                                                 const float* xs, int T, int r) {
  // All D loads are issued before the first add (independent loads in flight);
  // the adds then run in CSR order.
  uint4 iv[D / 8];
#pragma unroll
  for (int q = 0; q < D / 8; ++q) iv[q] = __ldg(ip + q * qstride);
  float x[D];
#pragma unroll
  for (int q = 0; q < D / 8; ++q) {
    const uint4 v = iv[q];
    x[8 * q + 0] = xs[(v.x & 0xffffu) * T + r];
    x[8 * q + 1] = xs[(v.x >> 16) * T + r];
    x[8 * q + 2] = xs[(v.y & 0xffffu) * T + r];
    x[8 * q + 3] = xs[(v.y >> 16) * T + r];
    x[8 * q + 4] = xs[(v.z & 0xffffu) * T + r];
    x[8 * q + 5] = xs[(v.z >> 16) * T + r];
    x[8 * q + 6] = xs[(v.w & 0xffffu) * T + r];
    x[8 * q + 7] = xs[(v.w >> 16) * T + r];
  }
  float acc = 0.0f;
#pragma unroll
  for (int p = 0; p < D; ++p) acc += x[p];
  return acc;
}

// Same gather from a tile in global memory (xt already offset by the lane).
template <int D>
__device__ __forceinline__ float gather_sum_global(const uint4* __restrict__ ip,
                                                   const float* __restrict__ xt) {
  uint4 iv[D / 8];
#pragma unroll
  for (int q = 0; q < D / 8; ++q) iv[q] = __ldg(ip + q);
  float x[D];
#pragma unroll
  for (int q = 0; q < D / 8; ++q) {
    const uint4 v = iv[q];
    x[8 * q + 0] = __ldg(xt + (v.x & 0xffffu) * 32);
    x[8 * q + 1] = __ldg(xt + (v.x >> 16) * 32);
    x[8 * q + 2] = __ldg(xt + (v.y & 0xffffu) * 32);
    x[8 * q + 3] = __ldg(xt + (v.y >> 16) * 32);
    x[8 * q + 4] = __ldg(xt + (v.z & 0xffffu) * 32);
    x[8 * q + 5] = __ldg(xt + (v.z >> 16) * 32);
    x[8 * q + 6] = __ldg(xt + (v.w & 0xffffu) * 32);
    x[8 * q + 7] = __ldg(xt + (v.w >> 16) * 32);
  }
  float acc = 0.0f;
#pragma unroll
  for (int p = 0; p < D; ++p) acc += x[p];
  return acc;
}

// Stage rows [sub*T, sub*T + T) of tile `xt` (n_in neurons) into xs[i * T + r].
template <int T>
__device__ __forceinline__ void stage_tile(float* xs, const float* __restrict__ xt, int n_in) {
  constexpr int V = T / 4;  // float4 per neuron
  const float4* src = reinterpret_cast<const float4*>(xt);
  float4* dst = reinterpret_cast<float4*>(xs);
  const int n = n_in * V;
  // 8 float4 = 32 floats per neuron in the tile. A plain load/store loop keeps
  // one load in flight per thread and waits a memory latency per 8 KB (seen on
  // the H200 in the SASS); cp.async issues them all, then waits once.
#if SPDNN_CP_ASYNC
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int i = e / V, v = e - i * V;
    cp_async16(dst + e, src + i * 8 + v);
  }
  cp_async_wait_all();
#else
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int i = e / V, v = e - i * V;
    dst[e] = __ldcg(src + i * 8 + v);
  }
#endif
}

template <int T, int D>
__global__ void __launch_bounds__(SPDNN_SMEM_THREADS, 1)
    layer_ell_smem(LAYER_PARAMS, const u16* __restrict__ idx, int n_slices) {
  LAYER_ARGS;
  constexpr int G = 32 / T;  // outputs per warp step
  constexpr int SUB = 32 / T;  // staged units per 32-row tile
  extern __shared__ float4 xs4[];
  float* xs = reinterpret_cast<float*>(xs4);
  __shared__ u32 s_alive;
  const int n_tiles = ld_state(a.state, ST_TILES);
  const int sel = ld_state(a.state, ST_SEL);
  const float* src = sel ? a.buf1 : a.buf0;
  float* dst = sel ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane / T, r = lane - g * T;
  const int n_units = n_tiles * SUB;
  // Split the outputs into chunks when there are few units, so every block works.
  int n_chunks = 1;
  if (n_units > 0) {
    n_chunks = (SPDNN_SMEM_ITEMS_PER_BLOCK * (int)gridDim.x + n_units - 1) / n_units;
    const int most = max(1, n_slices / (2 * nwarps));
    n_chunks = min(n_chunks, most);
  }
  const int per_chunk = (n_slices + n_chunks - 1) / n_chunks;
  const i64 n_items = (i64)n_units * n_chunks;
  const uint4* idx4 = reinterpret_cast<const uint4*>(idx);
  for (i64 item = blockIdx.x; item < n_items; item += gridDim.x) {
    const int unit = (int)(item / n_chunks), chunk = (int)(item - (i64)unit * n_chunks);
    const int t = unit / SUB, sub = unit - t * SUB;
    __syncthreads();  // previous item's readers are done with xs
    if (threadIdx.x == 0) s_alive = 0u;
    stage_tile<T>(xs, src + t * a.tstride + sub * T, a.n_in);
    __syncthreads();
    bool alive = false;
    const int s0 = chunk * per_chunk, s1 = min(n_slices, s0 + per_chunk);
    float* out = dst + t * a.tstride + sub * T + r;
#if SPDNN_SMEM_PAIRS
    // Two output slices per warp step: two independent load/add chains in flight.
    for (int s = s0 + warp; s < s1; s += 2 * nwarps) {
      const int s2 = s + nwarps < s1 ? s + nwarps : s;  // warp-uniform; repeat s when none
      const float acc = gather_sum_smem<D>(idx4 + (i64)s * (D / 8) * G + g, G, xs, T, r);
      const float acc2 = gather_sum_smem<D>(idx4 + (i64)s2 * (D / 8) * G + g, G, xs, T, r);
      const int j = s * G + g, j2 = s2 * G + g;
      if (j < a.n_out) {
        const float y = epilogue(acc, j, a);
        out[(i64)j * 32] = y;
        alive |= y > 0.0f;
      }
      if (s2 != s && j2 < a.n_out) {
        const float y = epilogue(acc2, j2, a);
        out[(i64)j2 * 32] = y;
        alive |= y > 0.0f;
      }
    }
#else
    for (int s = s0 + warp; s < s1; s += nwarps) {
      const int j = s * G + g;
      const float acc = gather_sum_smem<D>(idx4 + (i64)s * (D / 8) * G + g, G, xs, T, r);
      if (j < a.n_out) {
        const float y = epilogue(acc, j, a);
        out[(i64)j * 32] = y;
        alive |= y > 0.0f;
      }
    }
#endif
    u32 b = __ballot_sync(0xffffffffu, alive);
    if (T < 32) {
      u32 m = 0u;
#pragma unroll
      for (int gg = 0; gg < G; ++gg) m |= (b >> (gg * T)) & ((1u << (T & 31)) - 1u);
      b = m << (sub * T);
    }
    if (lane == 0 && b) atomicOr(&s_alive, b);
    __syncthreads();
    if (threadIdx.x == 0 && s_alive) atomicOr(mask + t, s_alive);
  }
  finish_layer(a);
}

// One work item of the L1/L2 kernels: outputs [chunk*per_chunk, +per_chunk) of
// tile t, WO consecutive outputs per warp, lane = row; ORs the alive rows into
// mask[t]. Called by all threads of the block.
template <int D>
__device__ __forceinline__ void global_item(const LayerArgs& a, const float* __restrict__ src,
                                            float* dst, u32* mask, const uint4* idx4, int t,
                                            int chunk, u32* s_alive) {
  constexpr int WO = SPDNN_GLOBAL_WARP_OUTPUTS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int per_chunk = nwarps * WO;
  if (threadIdx.x == 0) *s_alive = 0u;
  __syncthreads();
  const float* xt = src + t * a.tstride + lane;
  float* out = dst + t * a.tstride + lane;
  bool alive = false;
  const int j0 = chunk * per_chunk + warp * WO;
  const int j1 = min(a.n_out, j0 + WO);
  for (int j = j0; j < j1; ++j) {
    const float acc = gather_sum_global<D>(idx4 + (i64)j * (D / 8), xt);
    const float y = epilogue(acc, j, a);
    out[(i64)j * 32] = y;
    alive |= y > 0.0f;
  }
  const u32 b = __ballot_sync(0xffffffffu, alive);
  if (lane == 0 && b) atomicOr(s_alive, b);
  __syncthreads();
  if (threadIdx.x == 0 && *s_alive) atomicOr(mask + t, *s_alive);
}

template <int D>
__global__ void __launch_bounds__(SPDNN_GLOBAL_THREADS)
    layer_ell_global(LAYER_PARAMS, const u16* __restrict__ idx) {
  LAYER_ARGS;
  __shared__ u32 s_alive;
  const int n_tiles = ld_state(a.state, ST_TILES);
  const int sel = ld_state(a.state, ST_SEL);
  const float* src = sel ? a.buf1 : a.buf0;
  float* dst = sel ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
  const int per_chunk = (blockDim.x >> 5) * SPDNN_GLOBAL_WARP_OUTPUTS;
  const int n_chunks = (a.n_out + per_chunk - 1) / per_chunk;
  const i64 n_items = (i64)n_tiles * n_chunks;
  const uint4* idx4 = reinterpret_cast<const uint4*>(idx);
  for (i64 item = blockIdx.x; item < n_items; item += gridDim.x) {
    const int t = (int)(item / n_chunks), chunk = (int)(item - (i64)t * n_chunks);
    global_item<D>(a, src, dst, mask, idx4, t, chunk, &s_alive);
  }
  finish_layer(a);
}

// Same work as layer_ell_global, scheduled so that the blocks resident on one
// SM share one tile: tile t belongs to queue t % nq, a block takes items from
// the queue of the SM it runs on (then steals from the others), so the tile
// (n_in * 128 bytes) is read from L2 once per SM and the gathers hit in L1.
template <int D>
__global__ void __launch_bounds__(SPDNN_GLOBAL_THREADS)
    layer_ell_l1(LAYER_PARAMS, const u16* __restrict__ idx) {
  LAYER_ARGS;
  __shared__ u32 s_alive;
  __shared__ int s_take[2];
  const int n_tiles = ld_state(a.state, ST_TILES);
  const int sel = ld_state(a.state, ST_SEL);
  const float* src = sel ? a.buf1 : a.buf0;
  float* dst = sel ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
  u32* counters = a.counters + (a.k & 1) * a.nq;
  const int nq = a.nq;
  const int per_chunk = (blockDim.x >> 5) * SPDNN_GLOBAL_WARP_OUTPUTS;
  const int n_chunks = (a.n_out + per_chunk - 1) / per_chunk;
  const uint4* idx4 = reinterpret_cast<const uint4*>(idx);
  const int home = (int)(sm_id() % (unsigned)nq);
  int visited = 0;  // used by thread 0 only
  while (true) {
    if (threadIdx.x == 0) {
      int got = -1, gq = -1;
      while (visited < nq) {
        const int q = (home + visited) % nq;
        const int q_tiles = q < n_tiles ? (n_tiles - 1 - q) / nq + 1 : 0;
        const int q_items = q_tiles * n_chunks;
        if (q_items > 0) {
          const int w = (int)atomicAdd(counters + q, 1u);
          if (w < q_items) {
            got = w;
            gq = q;
            break;
          }
        }
        ++visited;
      }
      s_take[0] = got;
      s_take[1] = gq;
    }
    __syncthreads();
    const int w = s_take[0], q = s_take[1];
    __syncthreads();  // everyone has read s_take before thread 0 writes it again
    if (w < 0) break;
    const int t = q + (w / n_chunks) * nq, chunk = w - (w / n_chunks) * n_chunks;
    global_item<D>(a, src, dst, mask, idx4, t, chunk, &s_alive);
  }
  finish_layer(a);
}

// General CSR layer; I is the index type (u16 or int), VALS: per-nonzero values.
template <bool SMEM, bool VALS, typename I>
__global__ void __launch_bounds__(SPDNN_GLOBAL_THREADS)
    layer_csr(LAYER_PARAMS, const int* __restrict__ ptr, const I* __restrict__ idx,
              const float* __restrict__ vals) {
  LAYER_ARGS;
  extern __shared__ float4 xs4[];
  float* xs = reinterpret_cast<float*>(xs4);
  __shared__ u32 s_alive;
  const int n_tiles = ld_state(a.state, ST_TILES);
  const int sel = ld_state(a.state, ST_SEL);
  const float* src = sel ? a.buf1 : a.buf0;
  float* dst = sel ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int n_chunks;
  if (SMEM) {
    n_chunks = 1;
    if (n_tiles > 0) {
      n_chunks = (SPDNN_SMEM_ITEMS_PER_BLOCK * (int)gridDim.x + n_tiles - 1) / n_tiles;
      n_chunks = min(n_chunks, max(1, a.n_out / (2 * nwarps)));
    }
  } else {
    n_chunks = (a.n_out + nwarps * SPDNN_GLOBAL_WARP_OUTPUTS - 1) /
               (nwarps * SPDNN_GLOBAL_WARP_OUTPUTS);
  }
  const int per_chunk = (a.n_out + n_chunks - 1) / n_chunks;
  const i64 n_items = (i64)n_tiles * n_chunks;
  for (i64 item = blockIdx.x; item < n_items; item += gridDim.x) {
    const int t = (int)(item / n_chunks), chunk = (int)(item - (i64)t * n_chunks);
    __syncthreads();
    if (threadIdx.x == 0) s_alive = 0u;
    const float* xt;
    if (SMEM) {
      stage_tile<32>(xs, src + t * a.tstride, a.n_in);
      xt = xs + lane;
    } else {
      xt = src + t * a.tstride + lane;
    }
    __syncthreads();
    float* out = dst + t * a.tstride + lane;
    bool alive = false;
    const int j1 = min(a.n_out, (chunk + 1) * per_chunk);
    for (int j = chunk * per_chunk + warp; j < j1; j += nwarps) {
      const int p0 = __ldg(ptr + j), p1 = __ldg(ptr + j + 1);
      float acc = 0.0f;
#pragma unroll 4
      for (int p = p0; p < p1; ++p) {
        const i64 i = (i64)__ldg(idx + p);
        const float x = SMEM ? xt[i * 32] : __ldg(xt + i * 32);
        if (VALS) {
          acc = fmaf(__ldg(vals + p), x, acc);
        } else {
          acc += x;
        }
      }
      const float y = epilogue(acc, j, a);
      out[(i64)j * 32] = y;
      alive |= y > 0.0f;
    }
    const u32 b = __ballot_sync(0xffffffffu, alive);
    if (lane == 0 && b) atomicOr(&s_alive, b);
    __syncthreads();
    if (threadIdx.x == 0 && s_alive) atomicOr(mask + t, s_alive);
  }
  finish_layer(a);
}
