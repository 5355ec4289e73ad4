// Grouped layers: output neurons that read the same D inputs are computed
// together, so each input is loaded once for the whole group instead of once
// per output (block-sparse weights; every RadiX-Net layer, the official
// networks' included, is made of groups of 16 outputs sharing 32 inputs).
//
// A group holds up to 16 outputs (unused slots have output id -1) and one
// D x 16 weight block, k-major: w[k * 16 + o] is the weight of input k for
// slot o. Uniform layers pass one block of ones shared by every group
// (wstride 0) and their value as the epilogue scale, so each slot sums its
// inputs in CSR order exactly as the other kernels and the reference do;
// layers with values pass one block per group (wstride D * 16). Every slot
// does its own D multiply-adds: nothing is shared between outputs but the
// loaded inputs.
//
// A lane holds 4 consecutive rows of a tile (float4) and computes LS slots
// (SPDNN_GROUP_LANE_SLOTS) of one group: 8 lanes a group and 4 groups a warp
// step with LS = 16, 16 lanes and 2 groups with LS = 8 (their loads of the
// same inputs are one request). The host pads the group count to a multiple
// of 4. Units run tile-major, so the groups that read one input line of a tile
// run close together and the second read hits in L2. Once one tile of
// compressed rows is held, uniform layers run the few-row ELL kernels instead
// (the same sums; cuda.py), layers with values this kernel over that tile.
#include "spdnn_layer.cuh"

#ifndef SPDNN_GROUP_THREADS
#define SPDNN_GROUP_THREADS 256
#endif
#ifndef SPDNN_GROUP_MIN_BLOCKS
#define SPDNN_GROUP_MIN_BLOCKS 3  // blocks per SM the register budget must allow (3: 80 registers)
#endif
#ifndef SPDNN_GROUP_LANE_SLOTS
#define SPDNN_GROUP_LANE_SLOTS 8  // slots a lane computes: 8 (a group per 16 lanes) or 16 (per 8)
#endif
#ifndef SPDNN_GROUP_BATCH
#define SPDNN_GROUP_BATCH 8  // input loads issued per lane before their multiply-adds
#endif
#define GROUP_SLOTS 16

// LS slots of one group for this lane's 4 rows (wp, op: at the first of
// them; xq: the rows' neuron 0), stored in place at out or, compacting, to
// the rows' compacted slots in dst; returns the rows' alive bits.
template <int D, int LS, bool COMPACT>
__device__ __forceinline__ u32 group_rows4(const LayerArgs& a, const uint4* __restrict__ ip,
                                           const int4* __restrict__ op,
                                           const float4* __restrict__ wp, const float* xq,
                                           float* out, const Rows4To& o, float* dst) {
  constexpr int B = D < SPDNN_GROUP_BATCH ? D : SPDNN_GROUP_BATCH;
  static_assert(B % 2 == 0 && D % B == 0 && D % 8 == 0, "degree must be a multiple of 8");
  float4 acc[LS];
#pragma unroll
  for (int o = 0; o < LS; ++o) acc[o] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int p0 = 0; p0 < D; p0 += B) {
    float4 x[B];
#pragma unroll
    for (int p = 0; p < B; p += 2) {
      const uint4 iv = __ldg(ip + (p0 + p) / 8);
      const u32 w = (&iv.x)[((p0 + p) % 8) / 2];
      x[p] = __ldg(reinterpret_cast<const float4*>(xq + (w & 0xffffu) * 32));
      x[p + 1] = __ldg(reinterpret_cast<const float4*>(xq + (w >> 16) * 32));
    }
#pragma unroll
    for (int p = 0; p < B; ++p) {
      const float4* wk = wp + (p0 + p) * (GROUP_SLOTS / 4);
#pragma unroll
      for (int q = 0; q < LS / 4; ++q) {
        const float4 w = __ldg(wk + q);
        const float ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float4& c = acc[q * 4 + e];
          c.x = fmaf(ws[e], x[p].x, c.x);
          c.y = fmaf(ws[e], x[p].y, c.y);
          c.z = fmaf(ws[e], x[p].z, c.z);
          c.w = fmaf(ws[e], x[p].w, c.w);
        }
      }
    }
  }
  u32 alive = 0u;
  float* p[4];
  if constexpr (COMPACT) rows4_ptrs(o, dst, a.tstride, p);
#pragma unroll
  for (int q = 0; q < LS / 4; ++q) {
    const int4 o4 = __ldg(op + q);
    const int ids[4] = {o4.x, o4.y, o4.z, o4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (ids[e] < 0) continue;
      alive |= COMPACT ? store_rows4_at(acc[q * 4 + e], ids[e], a, p)
                       : store_rows4(acc[q * 4 + e], ids[e], a, out);
    }
  }
  return alive;
}

// The kernel's walk over (tile, warp step) units, in place or compacting.
template <int D, bool COMPACT>
__device__ __forceinline__ void group_walk(const LayerArgs& a, const Compaction& cmp,
                                           int n_groups, const u16* __restrict__ gidx,
                                           const int* __restrict__ gout,
                                           const float* __restrict__ gw, int wstride,
                                           int chunk) {
  const int n_tiles = ld_state(a.state, ST_TILES);
  const int sel = ld_state(a.state, ST_SEL);
  const float* src = sel ? a.buf1 : a.buf0;
  float* dst = sel ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
  constexpr int LS = SPDNN_GROUP_LANE_SLOTS;
  constexpr int SPLIT = GROUP_SLOTS / LS;  // quarter-warps per group
  constexpr int GPW = 4 / SPLIT;  // groups per warp step
  static_assert(LS % 4 == 0 && GROUP_SLOTS % LS == 0 && SPLIT <= 4, "lane slots: 4, 8 or 16");
  const int lane = threadIdx.x & 31, q = lane >> 3, r4 = (lane & 7) * 4;
  const int s0 = (q % SPLIT) * LS;  // this lane's first slot
  const int steps_per_tile = n_groups / GPW;
  const i64 n_steps = (i64)n_tiles * steps_per_tile;
  const i64 warp_id = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const i64 n_warps = (i64)gridDim.x * (blockDim.x >> 5);
  const uint4* gidx4 = reinterpret_cast<const uint4*>(gidx);
  const int4* gout4 = reinterpret_cast<const int4*>(gout);
  const float4* gw4 = reinterpret_cast<const float4*>(gw);
  for (i64 c = warp_id * chunk; c < n_steps; c += n_warps * chunk) {
    const i64 c_end = min(n_steps, c + chunk);
    int t_cur = (int)(c / steps_per_tile);
    Rows4To o = rows4_to<COMPACT>(cmp, t_cur, r4);
    u64 alive = 0ull;
    for (i64 s = c; s < c_end; ++s) {
      const int t = (int)(s / steps_per_tile);  // the same for the whole warp
      if (t != t_cur) {
        flush_alive(mask, o.t0, alive);
        t_cur = t;
        o = rows4_to<COMPACT>(cmp, t, r4);
        alive = 0ull;
      }
      const int step = (int)(s - (i64)t * steps_per_tile);
      const int g = step * GPW + q / SPLIT;
      if (COMPACT && step == 0 && q == 0) move_positions(cmp, o, t, r4);
      const i64 tile_at = (i64)t * a.tstride + r4;
      alive |= alive_at(group_rows4<D, LS, COMPACT>(a, gidx4 + (i64)g * (D / 8),
                                                    gout4 + ((i64)g * GROUP_SLOTS + s0) / 4,
                                                    gw4 + ((i64)g * wstride + s0) / 4,
                                                    src + tile_at, dst + tile_at, o, dst),
                        o);
    }
    flush_alive(mask, o.t0, alive);
  }
}

// n_groups: a multiple of 4. gidx: n_groups x D u16 input ids (CSR order),
// gout: n_groups x 16 output ids (-1: unused slot), gw: weight blocks,
// wstride: floats from one group's block to the next (0: one shared block),
// chunk: consecutive warp steps a warp takes before striding on (fewer atomics
// on the tile masks, but the warps then spread over more tiles at once: 1 was
// measured best, docs/performance.md).
template <int D>
__global__ void __launch_bounds__(SPDNN_GROUP_THREADS, SPDNN_GROUP_MIN_BLOCKS)
    layer_group(LAYER_PARAMS, int n_groups, const u16* __restrict__ gidx,
                const int* __restrict__ gout, const float* __restrict__ gw, int wstride,
                int chunk) {
  LAYER_ARGS;
  const Compaction cmp = compaction_of(a);
  if (cmp.on) {
    group_walk<D, true>(a, cmp, n_groups, gidx, gout, gw, wstride, chunk);
  } else {
    group_walk<D, false>(a, cmp, n_groups, gidx, gout, gw, wstride, chunk);
  }
  finish_layer(a, cmp.on);
}
