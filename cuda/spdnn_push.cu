// Layers pushed from their nonzero inputs: each nonzero input x[r, k] adds
// x[r, k] * W[k, j] to every output j that input k feeds, so zero inputs
// cost nothing. The first layer reads the batch's sparse input rows (most
// pixels of a digit are zero, and no dense tiles are built); a later layer
// reads the current tiles (ReLU zeros).
//
// A block takes units of R rows x one chunk of C outputs and keeps their sums
// in shared memory; warp w owns row w of the unit and walks its nonzero
// inputs in ascending k, its lanes over the outputs input k feeds in the chunk (each
// output once per k), with a __syncwarp between inputs. So every output's
// sum runs over its inputs in ascending k with one accumulator, as the CSR
// kernels do over sorted rows: the same fmaf chain (values) or adds (uniform)
// minus the terms of zero inputs, which leave an accumulator that starts at
// +0 unchanged (the host uses this form only with finite weights, sorted
// rows and, for the first layer, sorted, duplicate-free input rows). The
// whole of each 32-row tile is written; past the batch's rows, the first
// layer's from no inputs, as the zeroed tiles would.
//
// Layout (cuda_push.push_layout): for chunk c and input k, the entries
// ptr[c * (n_in + 1) + k] .. ptr[c * (n_in + 1) + k + 1] of out (the output
// within the chunk) and w (its weight; unused when uniform).
#include "spdnn_layer.cuh"

#ifndef SPDNN_PUSH_THREADS
#define SPDNN_PUSH_THREADS 256
#endif
#define PUSH_ROWS (SPDNN_PUSH_THREADS / 32)  // rows of a unit: one warp each
static_assert(32 % PUSH_ROWS == 0, "a unit's rows must divide a 32-row tile");

#ifndef SPDNN_PUSH_MIN_BLOCKS
#define SPDNN_PUSH_MIN_BLOCKS 4  // blocks an SM the push kernels are compiled for
#endif
#ifndef SPDNN_PUSH_SYNC
#define SPDNN_PUSH_SYNC 1  // 0 only to measure what the ordering costs: not exact without it
#endif
#ifndef SPDNN_PUSH_AHEAD
#define SPDNN_PUSH_AHEAD 8  // inputs whose entries are loaded at once
#endif
#ifndef SPDNN_PUSH_PER_LANE
#define SPDNN_PUSH_PER_LANE 2  // entries of an input a lane loads with them (32 each)
#endif

// One term of output j's sum: x times the weight (values) or x (uniform: the
// scale comes in the epilogue), as the CSR kernels add it.
template <bool VALS>
__device__ __forceinline__ void push_add(float* acc, int j, float wv, float x) {
  if constexpr (VALS) {
    acc[j] = fmaf(wv, x, acc[j]);
  } else {
    acc[j] += x;
  }
}

// Up to 32 inputs, lane q holding input q's value x and its entries e0..e1
// (q < n, ascending k), pushed into one row's sums of a chunk in that order.
// The entries of SPDNN_PUSH_AHEAD inputs (SPDNN_PUSH_PER_LANE per lane: the
// first 32 x that many of an input) are loaded at once, then added input by input from registers, so a
// memory latency is paid once per SPDNN_PUSH_AHEAD inputs, not per input;
// longer inputs add the rest in a loop of their own.
template <bool VALS>
__device__ __forceinline__ void push_inputs(float* acc, float x, int e0, int e1, int n,
                                            const u16* __restrict__ outs,
                                            const float* __restrict__ w) {
  constexpr int D = SPDNN_PUSH_AHEAD, H = SPDNN_PUSH_PER_LANE;
  const int lane = threadIdx.x & 31;
  for (int q0 = 0; q0 < n; q0 += D) {
    int j[D][H];
    float wv[D][H];
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int q = min(q0 + d, 31);
      const int b = __shfl_sync(0xffffffffu, e0, q), e = __shfl_sync(0xffffffffu, e1, q);
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const int p = b + 32 * h + lane;
        const bool has = q0 + d < n && p < e;
        j[d][h] = has ? (int)__ldg(outs + p) : -1;
        wv[d][h] = has && VALS ? __ldg(w + p) : 1.0f;
      }
    }
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int q = q0 + d;
      if (q < n) {  // uniform over the warp
        const float xq = __shfl_sync(0xffffffffu, x, q);
        const int b = __shfl_sync(0xffffffffu, e0, q), e = __shfl_sync(0xffffffffu, e1, q);
#pragma unroll
        for (int h = 0; h < H; ++h) {
          if (j[d][h] >= 0) push_add<VALS>(acc, j[d][h], wv[d][h], xq);  // lanes never meet
        }
        for (int p = b + 32 * H + lane; p < e; p += 32) {  // inputs with more entries
          push_add<VALS>(acc, __ldg(outs + p), VALS ? __ldg(w + p) : 1.0f, xq);
        }
#if SPDNN_PUSH_SYNC
        __syncwarp();  // the next input's adds see this one's
#endif
      }
    }
  }
}

// Input row entries [p0, p1) (CSR, sorted) pushed into one row's sums: lanes
// load 32 inputs' (k, x, entry span) at once.
template <bool VALS, typename I>
__device__ __forceinline__ void push_csr_row(float* acc, i64 p0, i64 p1,
                                             const I* __restrict__ in_idx,
                                             const float* __restrict__ in_vals,
                                             const int* __restrict__ ptr,
                                             const u16* __restrict__ outs,
                                             const float* __restrict__ w) {
  const int lane = threadIdx.x & 31;
  for (i64 base = p0; base < p1; base += 32) {
    const int n = (int)min((i64)32, p1 - base);
    float x = 0.0f;
    int e0 = 0, e1 = 0;
    if (lane < n) {
      const int k = (int)__ldg(in_idx + base + lane);
      x = in_vals ? __ldg(in_vals + base + lane) : 1.0f;
      if (x != 0.0f) {  // a zero input adds nothing: no entries
        e0 = __ldg(ptr + k);
        e1 = __ldg(ptr + k + 1);
      }
    }
    push_inputs<VALS>(acc, x, e0, e1, n, outs, w);
  }
}

// A dense row of n_in inputs (in shared memory) pushed into one row's sums:
// 32 inputs at a time, the nonzero ones moved to the first lanes in order.
template <bool VALS>
__device__ __forceinline__ void push_dense_row(float* acc, const float* xs, int n_in,
                                               const int* __restrict__ ptr,
                                               const u16* __restrict__ outs,
                                               const float* __restrict__ w) {
  const int lane = threadIdx.x & 31;
  for (int k0 = 0; k0 < n_in; k0 += 32) {
    const float v = k0 + lane < n_in ? xs[k0 + lane] : 0.0f;
    const u32 m = __ballot_sync(0xffffffffu, v != 0.0f);
    if (m == 0u) continue;
    const int n = __popc(m);
    const int from = lane < n ? (int)__fns(m, 0, lane + 1) : lane;  // the lane-th nonzero
    const float x = __shfl_sync(0xffffffffu, v, from);
    int e0 = 0, e1 = 0;
    if (lane < n) {
      e0 = __ldg(ptr + k0 + from);
      e1 = __ldg(ptr + k0 + from + 1);
    }
    push_inputs<VALS>(acc, x, e0, e1, n, outs, w);
  }
}

// VALS: per-entry weights (else uniform, the scale applied in the epilogue).
// DENSE: the inputs are the current tiles (a later layer), staged a unit's
// rows at a time; else the batch's sparse input rows (the first layer),
// whose index type is I (u16 or int).
template <bool VALS, bool DENSE, typename I>
__device__ __forceinline__ void push_layer(const LayerArgs& a, const i64* ptrs,
                                           const int* __restrict__ ptr,
                                           const u16* __restrict__ outs,
                                           const float* __restrict__ w, int chunk,
                                           int n_chunks) {
  extern __shared__ float smem[];
  const int stride = chunk + 1;  // padded rows of sums: no bank conflicts in the epilogue
  float* sums = smem;
  float* xs = smem + PUSH_ROWS * stride;  // DENSE: the unit's rows, n_in + 1 floats apart
  const int n_rows = ld_state(a.state, ST_ROWS);
  const int n_tiles = ld_state(a.state, ST_TILES);
  const int sel_buf = ld_state(a.state, ST_SEL);
  const float* src = sel_buf ? a.buf1 : a.buf0;
  float* dst = sel_buf ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int xstride = a.n_in + 1;
  const i64 n_units = (i64)n_tiles * (32 / PUSH_ROWS) * n_chunks;
  for (i64 u = blockIdx.x; u < n_units; u += gridDim.x) {
    const int g = (int)(u / n_chunks), c = (int)(u - (i64)g * n_chunks);
    const int j0 = c * chunk, width = min(chunk, a.n_out - j0);
    const int r = (g * PUSH_ROWS) & 31, t = (g * PUSH_ROWS) >> 5;
    __syncthreads();  // the previous unit's epilogue has read the sums
    for (int i = threadIdx.x; i < PUSH_ROWS * stride; i += blockDim.x) sums[i] = 0.0f;
    if constexpr (DENSE) {  // 8 rows of an input side by side: 32-byte reads
      const float* from = src + (i64)t * a.tstride + r;
      for (int i = threadIdx.x; i < PUSH_ROWS * a.n_in; i += blockDim.x) {
        const int k = i / PUSH_ROWS, row = i - k * PUSH_ROWS;
        xs[row * xstride + k] = __ldcg(from + (i64)k * 32 + row);
      }
    }
    __syncthreads();
    const int s = g * PUSH_ROWS + warp;
    if (s < n_rows) {
      const int* cptr = ptr + (i64)c * (a.n_in + 1);
      if constexpr (DENSE) {
        push_dense_row<VALS>(sums + warp * stride, xs + warp * xstride, a.n_in, cptr, outs, w);
      } else {
        const i64* in_indptr = reinterpret_cast<const i64*>(ptrs[P_IN_INDPTR]);
        const int q = __ldg(reinterpret_cast<const int*>(ptrs[P_IN_SEL]) + s);
        push_csr_row<VALS, I>(sums + warp * stride, __ldg(in_indptr + q),
                              __ldg(in_indptr + q + 1),
                              reinterpret_cast<const I*>(ptrs[P_IN_INDICES]),
                              reinterpret_cast<const float*>(ptrs[P_IN_VALUES]), cptr, outs, w);
      }
    }
    __syncthreads();
    // Epilogue: thread -> (row, output), 8 rows of an output side by side (32 bytes).
    const int row = threadIdx.x % PUSH_ROWS;
    float* out = dst + (i64)t * a.tstride + r + row;
    bool alive = false;
    for (int jj = threadIdx.x / PUSH_ROWS; jj < width; jj += blockDim.x / PUSH_ROWS) {
      const float y = epilogue(sums[row * stride + jj], j0 + jj, a);
      out[(i64)(j0 + jj) * 32] = y;
      alive |= y != 0.0f;
    }
    const bool real = g * PUSH_ROWS + row < n_rows;
    const u32 bits = __reduce_or_sync(0xffffffffu, alive && real ? 1u << (r + row) : 0u);
    if (lane == 0 && bits) atomicOr(mask + t, bits);
  }
  finish_layer(a, false);
}

// The first layer from the batch's sparse input rows (pointer table).
template <bool VALS, typename I>
__global__ void __launch_bounds__(SPDNN_PUSH_THREADS, SPDNN_PUSH_MIN_BLOCKS)
    layer_push(LAYER_PARAMS, const int* __restrict__ ptr, const u16* __restrict__ outs,
               const float* __restrict__ w, int chunk, int n_chunks) {
  LAYER_ARGS;
  push_layer<VALS, false, I>(a, ptrs, ptr, outs, w, chunk, n_chunks);
}

// A later layer from the current tiles, in place (compact_rows runs before it).
template <bool VALS>
__global__ void __launch_bounds__(SPDNN_PUSH_THREADS, SPDNN_PUSH_MIN_BLOCKS)
    layer_push_dense(LAYER_PARAMS, const int* __restrict__ ptr, const u16* __restrict__ outs,
                     const float* __restrict__ w, int chunk, int n_chunks) {
  LAYER_ARGS;
  push_layer<VALS, true, u16>(a, ptrs, ptr, outs, w, chunk, n_chunks);
}
