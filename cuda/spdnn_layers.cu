// One fused pass per layer: gather the inputs of each output neuron, sum,
// scale (uniform weights) or multiply-add (general weights), add the bias,
// activation (a lower bound: 0 for ReLU, -inf for none), clip, write the
// output once and mark the rows still alive (any output nonzero).  The last
// block to finish runs the plan (spdnn_common.cuh), so the layer loop never
// returns to the host.
//
// Kernels (all persistent: the grid is fixed at launch, the work comes from
// the device state, blocks past the live work exit at once):
//   layer_ell_smem<D>      uniform weights, D inputs per output; a block
//                          stages whole 32-row tiles in shared memory.
//   layer_ell_global<D>    same, inputs read through L1/L2 (large n_in).
//   layer_csr4<SMEM, VALS> any degree, per-nonzero values or uniform, 16-bit
//                          indices; the ELL kernels' float4 rows.
//   layer_csr<SMEM, VALS, I>  any CSR: variable degree, per-nonzero values,
//                          32-bit indices when n_in > 65536.
// Sums run in CSR order with one accumulator, as the scipy reference does,
// so a uniform power-of-two weight reproduces the reference bit for bit.
#include "spdnn_csr4.cuh"

// Copy a whole 32-row tile (n_in neurons, contiguous) into shared memory. A
// plain load/store loop keeps one load in flight per thread and waits a memory
// latency per 8 KB (seen on the H200 in the SASS); cp.async issues them all,
// then waits once.
// ROWS < 32: only the first ROWS rows of each neuron are held (compressed,
// converged layers), so only those are copied; the layout stays 32 wide.
template <int ROWS = 32>
__device__ __forceinline__ void stage_tile(float* xs, const float* __restrict__ xt, int n_in) {
  constexpr int Q = ROWS / 4;  // float4 per neuron
  const float4* from = reinterpret_cast<const float4*>(xt);
  float4* to = reinterpret_cast<float4*>(xs);
  const int n = n_in * Q;
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int at = Q == 8 ? e : (e / Q) * 8 + e % Q;
    cp_async16(to + at, from + at);
  }
  cp_async_wait_all();
}

// The ELL kernels give a lane 4 consecutive rows of a 32-row tile (one
// float4): 8 lanes compute one output, a warp 4 outputs per step, and each
// quarter-warp reads one 128-byte line per gather (no bank conflicts in
// shared memory, one L1 wavefront in global memory). One 16-byte load feeds
// four adds, so address arithmetic no longer competes with the loads for
// issue slots (late layers of the 1024-wide network: 47.7 -> 29.8 us against
// one float a lane, H200, 2026-12-02). When at most ROWS < 32 rows are
// held (one tile of compressed, converged rows), ROWS / 4 lanes compute an
// output and a gather reads ROWS * 4 bytes: fewer sectors per input.

// Sums of the D inputs of one output for this lane's 4 rows (sum_rows4): ip
// points at the output's D/8 uint4 of indices, xq at neuron 0 of this lane's rows.
template <int D, bool SMEM, int BATCH>
__device__ __forceinline__ float4 gather_rows4(const uint4* __restrict__ ip, const float* xq) {
  constexpr int B = D < BATCH ? D : BATCH;
  static_assert(B % 8 == 0 && D % B == 0, "degree must be a multiple of the batch");
  uint4 iv[D / 8];
#pragma unroll
  for (int q = 0; q < D / 8; ++q) iv[q] = __ldg(ip + q);
  return sum_rows4<D, B>(iv, xq, [](const float* p) { return load_rows4<SMEM>(p); });
}

// The block's range [begin, end) of the n_tiles x n_steps (tile, output step)
// units. Plain shares are contiguous and equal, so blocks differ by at most
// one unit, but with no more tiles than blocks (small batches) most shares
// straddle two tiles: such a block stages both and ends a round of its warps
// in each. Then each tile is split among gridDim.x / n_tiles blocks instead,
// where that costs at most one more round of the block's warps.
__device__ __forceinline__ void block_units(int n_tiles, int n_steps, int nwarps, i64& begin,
                                            i64& end) {
  const i64 n_units = (i64)n_tiles * n_steps;
  const i64 per_block = (n_units + gridDim.x - 1) / gridDim.x;
  if (n_tiles > 0 && n_tiles <= (int)gridDim.x) {
    const int parts = (int)gridDim.x / n_tiles;
    const int per_part = (n_steps + parts - 1) / parts;
    if (per_part <= per_block + nwarps) {
      // tile fastest: the blocks with work are the lowest ids, one per SM first
      const int part = (int)blockIdx.x / n_tiles, t = (int)blockIdx.x - part * n_tiles;
      const int c0 = part < parts ? min(n_steps, part * per_part) : n_steps;
      const int c1 = part < parts ? min(n_steps, c0 + per_part) : n_steps;
      begin = (i64)t * n_steps + c0;
      end = (i64)t * n_steps + c1;
      return;
    }
  }
  begin = min(n_units, (i64)blockIdx.x * per_block);
  end = min(n_units, begin + per_block);
}

// One ELL layer: the block takes a contiguous range of the (tile, output step)
// units (``block_units``), so each block meets a tile once: staged once
// (SMEM), its alive bits ORed once per warp. Output
// slot s computes output out_ids[s] (the host's locality order: slots that
// read the same inputs are neighbours, so their gathers hit in L1).
// The walk is shared by the ELL and the CSR4 kernels: sum(s, xq) returns the
// float4 of sums of output slot s for the lane's 4 rows at xq. It writes a
// pending compaction (spdnn_layer.cuh) and returns whether it did.
template <bool SMEM, int ROWS, bool COMPACT, typename Sum>
__device__ __forceinline__ void rows4_walk(const LayerArgs& a, const Compaction& cmp,
                                           const int* __restrict__ out_ids, float* xs, Sum sum) {
  constexpr int LANES = ROWS / 4;  // lanes per output
  constexpr int OUTPUTS_PER_STEP = 32 / LANES;
  const int n_tiles = ld_state(a.state, ST_TILES);
  const int sel = ld_state(a.state, ST_SEL);
  const float* src = sel ? a.buf1 : a.buf0;
  float* dst = sel ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane / LANES, r4 = (lane % LANES) * 4;
  const int n_steps = (a.n_out + OUTPUTS_PER_STEP - 1) / OUTPUTS_PER_STEP;
  i64 u_begin, u_end;
  block_units(n_tiles, n_steps, nwarps, u_begin, u_end);
  for (i64 u = u_begin; u < u_end;) {
    const int t = (int)(u / n_steps);
    const int c0 = (int)(u - (i64)t * n_steps);
    const int c1 = (int)min((i64)n_steps, c0 + (u_end - u));
    u += c1 - c0;
    const float* xq;
    if constexpr (SMEM) {
      __syncthreads();  // the previous tile's readers are done with xs
      stage_tile<ROWS>(xs, src + t * a.tstride, a.n_in);
      __syncthreads();
      xq = xs + r4;
    } else {
      xq = src + t * a.tstride + r4;
    }
    float* out = dst + t * a.tstride + r4;
    const Rows4To o = rows4_to<COMPACT, false>(cmp, t, r4);
    float* p[4];
    if constexpr (COMPACT) {
      rows4_ptrs(o, dst, a.tstride, p);
      if (c0 == 0 && warp == 0 && g == 0) move_positions(cmp, o, t, r4);
    }
    u64 alive = 0ull;
    for (int c = c0 + warp; c < c1; c += nwarps) {
      const int s = c * OUTPUTS_PER_STEP + g;
      if (s < a.n_out) {
        const int j = out_ids ? __ldg(out_ids + s) : s;
        const float4 acc = sum(s, xq);
        alive |= alive_at(COMPACT ? store_rows4_at(acc, j, a, p) : store_rows4(acc, j, a, out), o);
      }
    }
    flush_alive(mask, o.t0, alive);
  }
}

// The walk, in place or compacting; returns whether it compacted.
template <bool SMEM, int ROWS, typename Sum>
__device__ __forceinline__ bool rows4_layer(const LayerArgs& a, const int* __restrict__ out_ids,
                                            float* xs, Sum sum) {
  const Compaction cmp = compaction_of(a);
  if (cmp.on) {
    rows4_walk<SMEM, ROWS, true>(a, cmp, out_ids, xs, sum);
  } else {
    rows4_walk<SMEM, ROWS, false>(a, cmp, out_ids, xs, sum);
  }
  return cmp.on;
}

// Whole 32-row tiles staged in shared memory (n_in * 128 bytes, N <= 1792 on an H100/H200).
// ROWS: rows computed per tile (32; 16 or 8 once at most that many are held).
// FEW: at most one tile is held (few blocks, each lane's gathers all in flight).
template <int D, int ROWS, bool FEW>
__global__ void __launch_bounds__(SPDNN_SMEM_THREADS, 1)
    layer_ell_smem(LAYER_PARAMS, const u16* __restrict__ idx, const int* __restrict__ out_ids) {
  LAYER_ARGS;
  extern __shared__ float4 xs4[];
  const uint4* idx4 = reinterpret_cast<const uint4*>(idx);
  const bool took = rows4_layer<true, ROWS>(a, out_ids, reinterpret_cast<float*>(xs4),
                          [&](int s, const float* xq) {
                            return gather_rows4<D, true, FEW ? SPDNN_FEW_BATCH : SPDNN_ELL_BATCH>(
                                idx4 + (i64)s * (D / 8), xq);
                          });
  finish_layer(a, took);
}

// Gathers through L1/L2 (any n_in up to 65536).
template <int D, int ROWS, bool FEW>
__global__ void __launch_bounds__(SPDNN_GLOBAL_THREADS)
    layer_ell_global(LAYER_PARAMS, const u16* __restrict__ idx, const int* __restrict__ out_ids) {
  LAYER_ARGS;
  const uint4* idx4 = reinterpret_cast<const uint4*>(idx);
  const bool took = rows4_layer<false, ROWS>(a, out_ids, nullptr, [&](int s, const float* xq) {
    return gather_rows4<D, false, FEW ? SPDNN_FEW_BATCH : SPDNN_ELL_BATCH>(
        idx4 + (i64)s * (D / 8), xq);
  });
  finish_layer(a, took);
}

// Through L1/L2: the gathers of G (SPDNN_CSR4_GROUP) chunks are issued before
// the first of their adds, and the next G chunks' indices and values are
// loaded meanwhile, so an output of 8 G entries waits one gather latency, not
// G (the narrow head layers of small batches, whose few warps each wait for
// every chunk's gathers from L2 in turn).
template <bool VALS, int G>
__device__ __forceinline__ float4 csr_rows4_grouped(const uint4* __restrict__ ip,
                                                    const float4* __restrict__ vp, int deg,
                                                    const float* xq) {
  const int n = (deg + 7) / 8;  // chunks
  Csr4Chunk ring[G];
  csr4_first_chunks<VALS>(ring, ip, vp, n);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int c0 = 0; c0 < n; c0 += G) {
    float4 x[G][8];
    Csr4Chunk k[G];
#pragma unroll
    for (int q = 0; q < G; ++q) {
      k[q] = ring[q];
      if (c0 + q < n) csr4_gather<false>(x[q], k[q], xq);
    }
#pragma unroll
    for (int q = 0; q < G; ++q) {
      if (c0 + G + q < n) ring[q] = csr4_chunk<VALS>(ip, vp, c0 + G + q);
    }
#pragma unroll
    for (int q = 0; q < G; ++q) {
      if (c0 + q < n) csr4_fma<VALS>(acc, k[q], deg - 8 * (c0 + q), x[q]);
    }
  }
  return acc;
}

template <bool SMEM, bool VALS>
__device__ __forceinline__ float4 csr_rows4(const uint4* __restrict__ ip,
                                            const float4* __restrict__ vp, int deg,
                                            const float* xq) {
  if constexpr (SMEM) {
    return csr_rows4_staged<VALS>(ip, vp, deg, xq);
  } else {
    return csr_rows4_grouped<VALS, SPDNN_CSR4_GROUP>(ip, vp, deg, xq);
  }
}

// spans[j] = (first entry, degree) of output j in idx/vals (first a multiple of 8).
template <bool SMEM, bool VALS>
__global__ void __launch_bounds__(SMEM ? SPDNN_SMEM_THREADS : SPDNN_GLOBAL_THREADS,
                                  SMEM ? 1 : SPDNN_CSR4_MIN_BLOCKS)
    layer_csr4(LAYER_PARAMS, const int2* __restrict__ spans, const u16* __restrict__ idx,
               const float* __restrict__ vals) {
  LAYER_ARGS;
  extern __shared__ float4 xs4[];
  const uint4* idx4 = reinterpret_cast<const uint4*>(idx);
  const float4* vals4 = reinterpret_cast<const float4*>(vals);
  const bool took = rows4_layer<SMEM, 32>(a, nullptr, reinterpret_cast<float*>(xs4),
                        [&](int s, const float* xq) {
                          const int2 sp = __ldg(spans + s);
                          return csr_rows4<SMEM, VALS>(idx4 + sp.x / 8, vals4 + sp.x / 4, sp.y,
                                                      xq);
                        });
  finish_layer(a, took);
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
      n_chunks = (SPDNN_CSR_ITEMS_PER_BLOCK * (int)gridDim.x + n_tiles - 1) / n_tiles;
      n_chunks = min(n_chunks, max(1, a.n_out / (2 * nwarps)));
    }
  } else {
    n_chunks = (a.n_out + nwarps * SPDNN_CSR_WARP_OUTPUTS - 1) /
               (nwarps * SPDNN_CSR_WARP_OUTPUTS);
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
      alive |= y != 0.0f;
    }
    const u32 b = __ballot_sync(0xffffffffu, alive);
    if (lane == 0 && b) atomicOr(&s_alive, b);
    __syncthreads();
    if (threadIdx.x == 0 && s_alive) atomicOr(mask + t, s_alive);
  }
  finish_layer(a, false);  // never compacts on write: compact_rows runs before it
}
