// Grouped layers: output neurons that read the same D inputs are computed
// together, so each input is loaded once for the whole group instead of once
// per output (block-sparse weights; every RadiX-Net layer, the official
// networks' included, is made of groups of 16 outputs sharing 32 inputs).
//
// layer_group (layers with per-edge values): a group holds up to 16 outputs
// (unused slots have output id -1) and one D x 16 weight block, k-major:
// w[k * 16 + o] is the weight of input k for slot o (wstride D * 16 floats
// from one group's block to the next). Every slot does its own D
// multiply-adds: nothing is shared between outputs but the loaded inputs.
//
// A lane holds 4 consecutive rows of a tile (float4) and computes LS slots
// (SPDNN_GROUP_LANE_SLOTS) of one group: 8 lanes a group and 4 groups a warp
// step with LS = 16, 16 lanes and 2 groups with LS = 8 (their loads of the
// same inputs are one request). The host pads the group count to a multiple
// of 4. Units run tile-major, so the groups that read one input line of a tile
// run close together and the second read hits in L2. Once one tile of
// compressed rows is held, these kernels run over that tile on a small grid.
//
// layer_group_sum (uniform layers, one value for every weight): the outputs
// of a group read the same inputs with the same weight, so their sums are one
// and the same sequence of adds. It is done once per group and row (in CSR
// order, as the other kernels and the reference add) and each slot applies
// its own scale, bias and activation: the same bits, with 1/16 of the adds
// and no weight loads, so the kernel is a stream of input loads and output
// stores. Every live row and every output is still computed and written (no
// rows are merged: that is the compressed mode's business).
#include "spdnn_layer.cuh"

#define GROUP_SLOTS 16

// The input gathers keep their lines in L2 (evict-last). A tile's input line
// is read once by each group that has the input (two in RadiX-Net layers),
// and a tile's groups are walked by as many warps at once, so the two reads
// come in either order and up to a round of the grid apart, while the grid
// streams the other tiles' lines: under the default priority the head layers
// read up to 3.3x their inputs from DRAM (docs/design.md, "Where the direct
// time goes"). The outputs give way first (store_out). Reading a line
// evict-first at its last read in group order lost to this: the order of the
// two reads is not the groups'.
__device__ __forceinline__ u64 l2_keep_policy() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ float4 gather4(const float* p, u64 policy) {
  float4 v;
  asm("ld.global.nc.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(p), "l"(policy));
  return v;
}

// Binary inputs as bits (scatter_bits): a tile holds one word a neuron, bit r
// for row r, where the feature tile holds 32 floats. Rows r4 .. r4 + 3 of the
// word at p as the floats the feature tile would hold (0 or 1): the same values,
// so the same sums, from a 32nd of the bytes.
__device__ __forceinline__ float4 bits4(const u32* p, int r4, u64 policy) {
  u32 w;
  asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(w) : "l"(p), "l"(policy));
  w >>= r4;
  return make_float4((float)(w & 1u), (float)((w >> 1) & 1u), (float)((w >> 2) & 1u),
                     (float)((w >> 3) & 1u));
}

// Calls f(slot, output id) for each used slot of the LS a lane computes (op:
// at the first of them; unused slots have id -1).
template <int LS, typename F>
__device__ __forceinline__ void for_each_slot(const int4* __restrict__ op, F&& f) {
#pragma unroll
  for (int q = 0; q < LS / 4; ++q) {
    const int4 o4 = __ldg(op + q);
    const int ids[4] = {o4.x, o4.y, o4.z, o4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (ids[e] >= 0) f(q * 4 + e, ids[e]);
    }
  }
}

// Compacting epilogue of the shared-sum form. Every slot of a group stores
// the same rows, so the quarter-warp's live rows are put in slot order once
// (through stage, 32 floats of this quarter) and its 8 lanes then store 8
// consecutive slots at a time, one or two 32-byte sectors, where each lane
// would store its own 4 scattered rows (4 sectors an instruction); with
// padding (o.pad), the slots after the tile's last survivor up to the next
// multiple of 8 get zeros (spdnn_layer.cuh, compaction on write). Returns the
// alive bits as bits of output tiles o.t0, o.t0 + 1.
template <int LS>
__device__ __forceinline__ u64 sum_store_compacted(float4 acc, const int4* __restrict__ op,
                                                   const LayerArgs& a, const Rows4To& o,
                                                   float* dst, float* stage) {
  const int lane = threadIdx.x & 31, ql = lane & 7;
  const int base = __shfl_sync(0xffffffffu, o.first, lane & ~7);  // the tile's first slot
  const int cnt = __shfl_sync(0xffffffffu, o.first + __popc(o.live), lane | 7) - base;
  const int padded = o.pad ? padded_slots(cnt) : cnt;
  const float v[4] = {acc.x, acc.y, acc.z, acc.w};
  __syncwarp();
  int k = o.first - base;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if ((o.live >> e) & 1u) stage[k++] = v[e];
  }
  __syncwarp();
  float4 sums;
  float* sp = &sums.x;
  float* p[4];
  u32 valid = 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int kk = ql + 8 * i;
    const int slot = base + kk;
    const bool in = kk < cnt;
    valid |= (u32)in << i;
    sp[i] = in ? stage[kk] : 0.0f;
    p[i] = kk < padded ? dst + (i64)(slot >> 5) * a.tstride + (slot & 31) : nullptr;
  }
  u32 alive = 0u;
  for_each_slot<LS>(op, [&](int, int id) {
    const float4 y = activate4(sums, id, a);
    const float ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (p[i]) store_out(p[i] + (i64)id * 32, o.pad && !((valid >> i) & 1u) ? 0.0f : ys[i]);
    }
    alive |= alive4(y);
  });
  alive &= valid;
  const int rel = base - o.t0 * 32 + ql;
  u64 bits = 0ull;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if ((alive >> i) & 1u) bits |= 1ull << (rel + 8 * i);
  }
  return bits;
}

// LS slots of one group for this lane's 4 rows (wp, op: at the first of
// them; xq: the rows' neuron 0, gathered under L2 policy keep), stored in
// place at out or, compacting, to the rows' compacted slots in dst; returns
// the rows' alive bits as bits of output tiles o.t0, o.t0 + 1. SUM: one sum
// for every slot (uniform layers; wp unused; compacting, through stage:
// sum_store_compacted). BITS: the input tile holds bits (bits4; xq - r4 its
// first word).
template <int D, int LS, bool COMPACT, bool SUM, bool BITS = false>
__device__ __forceinline__ u64 group_rows4(const LayerArgs& a, const uint4* __restrict__ ip,
                                           const int4* __restrict__ op,
                                           const float4* __restrict__ wp, const float* xq,
                                           u64 keep, float* out, const Rows4To& o, float* dst,
                                           float* stage) {
  constexpr int BATCH = SUM ? SPDNN_GSUM_BATCH : SPDNN_GROUP_BATCH;
  constexpr int B = D < BATCH ? D : BATCH;
  static_assert(B % 2 == 0 && D % B == 0 && D % 8 == 0, "degree must be a multiple of 8");
  constexpr int NACC = SUM ? 1 : LS;
  float4 acc[NACC];
#pragma unroll
  for (int o = 0; o < NACC; ++o) acc[o] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int p0 = 0; p0 < D; p0 += B) {
    float4 x[B];
#pragma unroll
    for (int p = 0; p < B; p += 2) {
      const uint4 iv = __ldg(ip + (p0 + p) / 8);
      const u32 w = (&iv.x)[((p0 + p) % 8) / 2];
      if constexpr (BITS) {
        const int r4 = (threadIdx.x & 7) * 4;
        const u32* words = reinterpret_cast<const u32*>(xq - r4);
        x[p] = bits4(words + (w & 0xffffu), r4, keep);
        x[p + 1] = bits4(words + (w >> 16), r4, keep);
      } else {
        x[p] = gather4(xq + (w & 0xffffu) * 32, keep);
        x[p + 1] = gather4(xq + (w >> 16) * 32, keep);
      }
    }
    if constexpr (SUM) {
#pragma unroll
      for (int p = 0; p < B; ++p) {  // fmaf(1, x, c) == c + x: the slots' sums exactly
        acc[0].x = __fadd_rn(acc[0].x, x[p].x);
        acc[0].y = __fadd_rn(acc[0].y, x[p].y);
        acc[0].z = __fadd_rn(acc[0].z, x[p].z);
        acc[0].w = __fadd_rn(acc[0].w, x[p].w);
      }
    } else {
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
  }
  if constexpr (SUM && COMPACT) {
    return sum_store_compacted<LS>(acc[0], op, a, o, dst, stage);
  }
  u32 alive = 0u;
  float* p[4];
  if constexpr (COMPACT) rows4_ptrs(o, dst, a.tstride, p);
  for_each_slot<LS>(op, [&](int slot, int id) {
    const float4& c = acc[SUM ? 0 : slot];
    alive |= COMPACT ? store_rows4_at(c, id, a, p) : store_rows4(c, id, a, out);
  });
  return alive_at(alive, o);
}

// The kernel's walk over (tile, warp step) units, in place or compacting; LS
// slots a lane, SUM and BITS as in group_rows4.
template <int D, int LS, bool COMPACT, bool PAD, bool SUM, bool BITS = false>
__device__ __forceinline__ void group_walk(const LayerArgs& a, const Compaction& cmp,
                                           int n_groups, const u16* __restrict__ gidx,
                                           const int* __restrict__ gout,
                                           const float* __restrict__ gw, int wstride,
                                           int chunk, float* stage) {
  const u64 keep = l2_keep_policy();
  const int n_tiles = ld_state(a.state, ST_TILES);
  const int sel = ld_state(a.state, ST_SEL);
  const float* src = sel ? a.buf1 : a.buf0;
  float* dst = sel ? a.buf0 : a.buf1;
  u32* mask = a.masks + (a.k & 1) * a.max_tiles;
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
    Rows4To o = rows4_to<COMPACT, PAD>(cmp, t_cur, r4);
    u64 alive = 0ull;
    for (i64 s = c; s < c_end; ++s) {
      const int t = (int)(s / steps_per_tile);  // the same for the whole warp
      if (t != t_cur) {
        flush_alive(mask, o.t0, alive);
        t_cur = t;
        o = rows4_to<COMPACT, PAD>(cmp, t, r4);
        alive = 0ull;
      }
      const int step = (int)(s - (i64)t * steps_per_tile);
      const int g = step * GPW + q / SPLIT;
      if (COMPACT && step == 0 && q == 0) move_positions(cmp, o, t, r4);
      const i64 tile_at = (i64)t * a.tstride + r4;
      alive |= group_rows4<D, LS, COMPACT, SUM, BITS>(a, gidx4 + (i64)g * (D / 8),
                                                gout4 + ((i64)g * GROUP_SLOTS + s0) / 4,
                                                gw4 + ((i64)g * wstride + s0) / 4,
                                                src + tile_at, keep, dst + tile_at, o, dst,
                                                stage);
    }
    flush_alive(mask, o.t0, alive);
  }
}

// n_groups: a multiple of 4. gidx: n_groups x D u16 input ids (CSR order),
// gout: n_groups x 16 output ids (-1: unused slot), gw: weight blocks,
// wstride: floats from one group's block to the next (0: one shared block),
// chunk: consecutive warp steps a warp takes before striding on (fewer atomics
// on the tile masks, but the warps then spread over more tiles at once: 1
// measured best, launch.py GROUP_CHUNK).
template <int D>
__global__ void __launch_bounds__(SPDNN_GROUP_THREADS, SPDNN_GROUP_MIN_BLOCKS)
    layer_group(LAYER_PARAMS, int n_groups, const u16* __restrict__ gidx,
                const int* __restrict__ gout, const float* __restrict__ gw, int wstride,
                int chunk) {
  LAYER_ARGS;
  const Compaction cmp = compaction_of(a);
  constexpr int LS = SPDNN_GROUP_LANE_SLOTS;
  with_form<false>(cmp, [&](auto form) {
    group_walk<D, LS, decltype(form)::compact, false, false>(a, cmp, n_groups, gidx, gout, gw,
                                                             wstride, chunk, nullptr);
  });
  finish_layer(a, cmp.on);
}

// The shared-sum form for uniform layers (gw, wstride: unused, kept so both
// forms take the same arguments): a lane computes all 16 slots of its group
// from one sum, 4 groups a warp step. Layer 0 of a batch whose inputs were
// loaded as bits (ST_INPUT_BITS; nothing is compacted before it) reads them so.
template <int D>
__global__ void __launch_bounds__(SPDNN_GROUP_THREADS, SPDNN_GSUM_MIN_BLOCKS)
    layer_group_sum(LAYER_PARAMS, int n_groups, const u16* __restrict__ gidx,
                    const int* __restrict__ gout, const float* __restrict__ gw, int wstride,
                    int chunk) {
  LAYER_ARGS;
  __shared__ float stage[SPDNN_GROUP_THREADS * 4];  // 32 floats a quarter-warp
  float* my_stage = stage + (threadIdx.x >> 3) * 32;
  const Compaction cmp = compaction_of(a);
  const bool bits = a.k == 0 && ld_state(a.state, ST_INPUT_BITS);
  with_form<true>(cmp, [&](auto form) {
    constexpr bool compact = decltype(form)::compact, pad = decltype(form)::pad;
    if constexpr (!compact) {
      if (bits) {
        group_walk<D, GROUP_SLOTS, false, false, true, true>(a, cmp, n_groups, gidx, gout, gw,
                                                             wstride, chunk, my_stage);
        return;
      }
    }
    group_walk<D, GROUP_SLOTS, compact, pad, true>(a, cmp, n_groups, gidx, gout, gw, wstride,
                                                   chunk, my_stage);
  });
  finish_layer<true>(a, cmp.on, cmp.pad);
}
