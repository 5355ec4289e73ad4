// The first layer pushed from the sparse input rows: each nonzero input
// x[r, k] adds x[r, k] * W[k, j] to every output j that input k feeds, so the
// zeros of the inputs (most pixels of a digit) cost nothing, and the dense
// tiles the other kernels read are never built.
//
// A block takes units of R rows x one chunk of C outputs and keeps their sums
// in shared memory; warp w owns row w of the unit and walks its inputs in
// ascending k, its lanes over the outputs input k feeds in the chunk (each
// output once per k), with a __syncwarp between inputs. So every output's
// sum runs over its inputs in ascending k with one accumulator, as the CSR
// kernels do over sorted rows: the same fmaf chain (values) or adds (uniform)
// minus the terms of zero inputs, which leave an accumulator that starts at
// +0 unchanged (the host uses this form only with finite weights, sorted
// rows and sorted, duplicate-free input rows). The whole of each 32-row tile
// is written, rows past the batch from no inputs, as the zeroed tiles would.
//
// Layout (cuda_layout.push_layout): for chunk c and input k, the entries
// ptr[c * (n_in + 1) + k] .. ptr[c * (n_in + 1) + k + 1] of out (the output
// within the chunk) and w (its weight; unused when uniform).
#include "spdnn_layer.cuh"

#ifndef SPDNN_PUSH_THREADS
#define SPDNN_PUSH_THREADS 256
#endif
#define PUSH_ROWS (SPDNN_PUSH_THREADS / 32)  // rows of a unit: one warp each
static_assert(32 % PUSH_ROWS == 0, "a unit's rows must divide a 32-row tile");

#ifndef SPDNN_PUSH_AHEAD
#define SPDNN_PUSH_AHEAD 4  // inputs whose first entries a lane loads ahead
#endif

// The lane's first entry (output, weight) of input q of the 32 a lane holds
// (span e0..e1): output -1 where the lane has none.
__device__ __forceinline__ void push_entry(int q, int e0, int e1, const u16* __restrict__ outs,
                                           const float* __restrict__ w, bool vals, int& j,
                                           float& wv) {
  const int p = __shfl_sync(0xffffffffu, e0, q) + (threadIdx.x & 31);
  const bool has = p < __shfl_sync(0xffffffffu, e1, q);
  j = has ? (int)__ldg(outs + p) : -1;
  wv = has && vals ? __ldg(w + p) : 1.0f;
}

// Row entries [p0, p1) of the batch's inputs pushed into one row's sums of a
// chunk. Lanes load 32 inputs' (k, x, entry span) at once, then take the
// inputs in order, each lane its entry of input q while the entries of the
// next SPDNN_PUSH_AHEAD inputs are in flight (one latency per input otherwise).
template <bool VALS, typename I>
__device__ __forceinline__ void push_row(float* acc, i64 p0, i64 p1, const I* __restrict__ in_idx,
                                         const float* __restrict__ in_vals,
                                         const int* __restrict__ ptr,
                                         const u16* __restrict__ outs,
                                         const float* __restrict__ w) {
  constexpr int D = SPDNN_PUSH_AHEAD;
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
    int jn[D];
    float wn[D];
#pragma unroll
    for (int d = 0; d < D; ++d) {
      jn[d] = -1;
      wn[d] = 0.0f;
      if (d < n) push_entry(d, e0, e1, outs, w, VALS, jn[d], wn[d]);
    }
    for (int q0 = 0; q0 < n; q0 += D) {
#pragma unroll
      for (int d = 0; d < D; ++d) {
        const int q = q0 + d;
        if (q < n) {  // uniform over the warp
          const int j = jn[d];
          const float wv = wn[d];
          const float xq = __shfl_sync(0xffffffffu, x, q);
          const int b = __shfl_sync(0xffffffffu, e0, q), e = __shfl_sync(0xffffffffu, e1, q);
          if (q + D < n) push_entry(q + D, e0, e1, outs, w, VALS, jn[d], wn[d]);
          if (j >= 0) {
            if constexpr (VALS) {
              acc[j] = fmaf(wv, xq, acc[j]);
            } else {
              acc[j] += xq;
            }
          }
          for (int p = b + 32 + lane; p < e; p += 32) {  // inputs with more than 32 entries
            const int jt = __ldg(outs + p);
            if constexpr (VALS) {
              acc[jt] = fmaf(__ldg(w + p), xq, acc[jt]);
            } else {
              acc[jt] += xq;
            }
          }
          __syncwarp();  // the next input's adds see this one's
        }
      }
    }
  }
}

// VALS: per-entry weights (else uniform, the scale applied in the epilogue);
// I: the input rows' index type (u16 or int).
template <bool VALS, typename I>
__global__ void __launch_bounds__(SPDNN_PUSH_THREADS)
    layer_push(LAYER_PARAMS, const int* __restrict__ ptr, const u16* __restrict__ outs,
               const float* __restrict__ w, int chunk, int n_chunks) {
  LAYER_ARGS;
  extern __shared__ float sums[];  // PUSH_ROWS rows of chunk + 1 floats (padded: no conflicts)
  const i64* in_indptr = reinterpret_cast<const i64*>(ptrs[P_IN_INDPTR]);
  const I* in_idx = reinterpret_cast<const I*>(ptrs[P_IN_INDICES]);
  const float* in_vals = reinterpret_cast<const float*>(ptrs[P_IN_VALUES]);
  const int* sel = reinterpret_cast<const int*>(ptrs[P_IN_SEL]);
  const int n_rows = ld_state(a.state, ST_ROWS);
  const int n_tiles = ld_state(a.state, ST_TILES);
  float* dst = ld_state(a.state, ST_SEL) ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int stride = chunk + 1;
  const i64 n_units = (i64)n_tiles * (32 / PUSH_ROWS) * n_chunks;
  for (i64 u = blockIdx.x; u < n_units; u += gridDim.x) {
    const int g = (int)(u / n_chunks), c = (int)(u - (i64)g * n_chunks);
    const int j0 = c * chunk, width = min(chunk, a.n_out - j0);
    __syncthreads();  // the previous unit's epilogue has read the sums
    for (int i = threadIdx.x; i < PUSH_ROWS * stride; i += blockDim.x) sums[i] = 0.0f;
    __syncthreads();
    const int s = g * PUSH_ROWS + warp;
    if (s < n_rows) {
      const int q = __ldg(sel + s);
      push_row<VALS, I>(sums + warp * stride, __ldg(in_indptr + q), __ldg(in_indptr + q + 1),
                        in_idx, in_vals, ptr + (i64)c * (a.n_in + 1), outs, w);
    }
    __syncthreads();
    // Epilogue: thread -> (row, output), 8 rows of an output side by side (32 bytes).
    const int row = threadIdx.x % PUSH_ROWS;
    const int r = (g * PUSH_ROWS) & 31, t = (g * PUSH_ROWS) >> 5;
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
