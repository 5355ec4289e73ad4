// The arguments every layer kernel takes and the epilogue they share: bias,
// activation, clip, one store per output, alive bits, and the plan run by the
// last block (spdnn_common.cuh).
#pragma once
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
  float floor;  // 0 for ReLU, -inf for no activation
  float clip;  // +inf for none
  int* state;
  u32* masks;  // two parities of max_tiles words
  int max_tiles;
  int* tile_base;
  int* live_hist;
  u64* stamps;
  int k;
  int drop_dead;
  int* pos0;
  int* pos1;
};

// Kernel parameters are passed flat (no struct crosses the host boundary) and
// gathered into LayerArgs inside the kernel.
#define LAYER_PARAMS                                                                     \
  const i64 *ptrs, int n_in, int n_out, float scale, float bias_s, const float *bias_v,    \
      float floor, float clip, int *state, int *live_hist, u64 *stamps, int k, int drop_dead
#define LAYER_ARGS                                                                   \
  const LayerArgs a = {reinterpret_cast<float*>(ptrs[P_BUF0]),                       \
                       reinterpret_cast<float*>(ptrs[P_BUF1]),                       \
                       ptrs[P_TSTRIDE],                                              \
                       n_in,                                                         \
                       n_out,                                                        \
                       scale,                                                        \
                       bias_s,                                                       \
                       bias_v,                                                       \
                       floor,                                                        \
                       clip,                                                         \
                       state,                                                        \
                       reinterpret_cast<u32*>(ptrs[P_MASKS]),                        \
                       (int)ptrs[P_MAX_TILES],                                       \
                       reinterpret_cast<int*>(ptrs[P_TILE_BASE]),                    \
                       live_hist,                                                    \
                       stamps,                                                       \
                       k,                                                            \
                       drop_dead,                                                    \
                       reinterpret_cast<int*>(ptrs[P_POS0]),                         \
                       reinterpret_cast<int*>(ptrs[P_POS1])}

__device__ __forceinline__ float bias_of(int j, const LayerArgs& a) {
  return a.bias_v ? __ldg(a.bias_v + j) : a.bias_s;
}

// scale * acc + bias, then the activation (ReLU: floor 0; none: floor -inf) and the clip.
__device__ __forceinline__ float activate(float acc, float scale, float b, float floor,
                                          float clip) {
  return fminf(fmaxf(fmaf(acc, scale, b), floor), clip);
}

// The same for 4 rows of one output.
__device__ __forceinline__ float4 activate4(float4 acc, float scale, float b, float floor,
                                            float clip) {
  return make_float4(activate(acc.x, scale, b, floor, clip),
                     activate(acc.y, scale, b, floor, clip),
                     activate(acc.z, scale, b, floor, clip),
                     activate(acc.w, scale, b, floor, clip));
}

__device__ __forceinline__ float activate(float acc, float b, const LayerArgs& a) {
  return activate(acc, a.scale, b, a.floor, a.clip);
}

__device__ __forceinline__ float epilogue(float acc, int j, const LayerArgs& a) {
  return activate(acc, bias_of(j, a), a);
}

// The plan of this layer (last block); ``took``: it wrote a pending
// compaction (compact on write, below), ``padded``: to 8-aligned slots.
// PADS: the kernel has a padded walk (with_form). Kernels without one call
// finish_layer(a, took) with the defaults: spelling finish_layer<false>(...) in
// them, or passing with_form's result as ``padded``, crashed nvcc 13.0's front
// end (internal error in i_copy_expr_tree).
template <bool PADS = false>
__device__ __forceinline__ void finish_layer(const LayerArgs& a, bool took,
                                             bool padded = false) {
  if (last_block_done(a.state)) {
    u32* mask = a.masks + (a.k & 1) * a.max_tiles;
    u32* next = a.masks + ((a.k + 1) & 1) * a.max_tiles;
    block_plan<PADS>(a.state, mask, next, a.tile_base, a.max_tiles, a.live_hist, a.stamps,
                     a.k, a.drop_dead, took, padded, a.n_out);
  }
}

__device__ __forceinline__ float4 activate4(float4 acc, int j, const LayerArgs& a) {
  return activate4(acc, a.scale, bias_of(j, a), a.floor, a.clip);
}

// acc += x, row by row (rounded adds: no multiply to contract them with).
__device__ __forceinline__ void add_rows4(float4& acc, const float4 x) {
  acc.x += x.x;
  acc.y += x.y;
  acc.z += x.z;
  acc.w += x.w;
}

// Sums of one output's D inputs for 4 rows (xq: the rows' neuron 0, neuron i at
// xq + 32 i), from its input ids in registers (iv: D / 8 uint4 of u16 pairs):
// B loads (load(p) -> float4) issued before their adds, the adds in CSR order,
// one accumulator per row.
template <int D, int B, typename Load>
__device__ __forceinline__ float4 sum_rows4(const uint4 (&iv)[D / 8], const float* xq,
                                            Load load) {
  static_assert(D % B == 0 && B % 2 == 0, "batch must divide the degree");
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int p0 = 0; p0 < D; p0 += B) {
    float4 x[B];
#pragma unroll
    for (int p = 0; p < B; p += 2) {
      const u32 w = (&iv[(p0 + p) / 8].x)[((p0 + p) % 8) / 2];
      x[p] = load(xq + (w & 0xffffu) * 32);
      x[p + 1] = load(xq + (w >> 16) * 32);
    }
#pragma unroll
    for (int p = 0; p < B; ++p) add_rows4(acc, x[p]);
  }
  return acc;
}

__device__ __forceinline__ u32 alive4(const float4 y) {
  return (u32)(y.x != 0.0f) | (u32)(y.y != 0.0f) << 1 | (u32)(y.z != 0.0f) << 2 |
         (u32)(y.w != 0.0f) << 3;
}

// A layer's outputs, stored evict-first (st.global.cs): the next layer reads
// them after this one has finished, so in L2 they give way to the input lines
// this layer has still to read again (l2_keep_policy in spdnn_groups.cu).
__device__ __forceinline__ void store_out(float* p, float v) { __stcs(p, v); }
__device__ __forceinline__ void store_out4(float* p, float4 v) {
  __stcs(reinterpret_cast<float4*>(p), v);
}

// Epilogue of 4 rows of output j, one 16-byte store; returns their alive bits.
__device__ __forceinline__ u32 store_rows4(float4 acc, int j, const LayerArgs& a, float* out) {
  const float4 y = activate4(acc, j, a);
  store_out4(out + (i64)j * 32, y);
  return alive4(y);
}

// Compaction on write. When the previous layer's plan asked for a compaction
// (ST_DO_COMPACT), the kernels below (the grouped and the float4-row ones)
// read their input rows in place and write each row that survived the
// previous layer straight to its compacted slot, so no pass of its own moves
// the survivors (the host launches compact_rows only before other kernels);
// the layer's plan then takes the new row count (block_plan). While rows die
// fast (COMPACT_PADDED), each input tile's survivors start at an 8-aligned
// slot (tile_slot, the second half of tile_base) and the slots up to the next
// multiple of 8 after them are written as dead rows (zero features, position
// -1), so no 32-byte sector of the output is stored by two warps: a sector two
// warps filled in part went to DRAM twice and was read back to merge
// (docs/design.md).
struct Compaction {
  bool on;
  const u32* live;  // the previous layer's alive bits of the input tiles
  const int* tile_base;  // compacted slot of each input tile's first survivor; after
                         // max_tiles, its 8-aligned slot (tile_slot)
  int max_tiles;
  bool pad;  // the plan asked for 8-aligned slots, padded with dead rows
  const int* pos_from;
  int* pos_to;
  int n_rows;  // input rows (before the compaction)
};

__device__ __forceinline__ Compaction compaction_of(const LayerArgs& a) {
  Compaction c;
  const int how = ld_state(a.state, ST_DO_COMPACT);
  c.on = how != COMPACT_NONE;
  c.live = a.masks + ((a.k + 1) & 1) * a.max_tiles;
  c.pad = how == COMPACT_PADDED;
  c.tile_base = a.tile_base;
  c.max_tiles = a.max_tiles;
  const int pos_sel = ld_state(a.state, ST_POS_SEL);
  c.pos_from = pos_sel ? a.pos1 : a.pos0;
  c.pos_to = pos_sel ? a.pos0 : a.pos1;
  c.n_rows = ld_state(a.state, ST_ROWS);
  return c;
}

// Where a lane's 4 rows (r4 .. r4 + 3) of input tile t go. In place: at
// row r4 of tile t of the output (t0 = t, first = 32 t + r4, live = all);
// compacting: the rows of ``live`` go to slots first, first + 1, ... and t0
// is the output tile of the input tile's first survivor (its survivors span
// tiles t0 and t0 + 1).
struct Rows4To {
  int t0;
  int first;
  u32 live;
  bool pad;  // the tile's survivors are followed by padding slots up to a multiple of 8
};

template <bool COMPACT, bool PAD>
__device__ __forceinline__ Rows4To rows4_to(const Compaction& c, int t, int r4) {
  if (!COMPACT) return {t, t * 32 + r4, 0xfu, false};
  const u32 m = __ldcg(c.live + t) & valid_bits(t, c.n_rows);
  const int base = __ldcg(c.tile_base + (PAD ? c.max_tiles : 0) + t);
  return {base >> 5, base + __popc(m & ((1u << r4) - 1u)), (m >> r4) & 0xfu, PAD};
}

// Calls walk(Form<COMPACT, PAD>{}) with the pending compaction's form as
// compile-time constants, so each form is compiled on its own: the in-place
// and exact walks carry none of the padded walk's code (with it, the exact
// compacting layers at N = 4096 ran 7-15 % slower, H100, 2026-12-06). A
// kernel without a padded walk (PADS false) compacts a padded plan exactly
// (tile_base holds the exact slots too) and tells finish_layer so.
template <bool C, bool P>
struct Form {
  static constexpr bool compact = C, pad = P;
};

template <bool PADS, typename Walk>
__device__ __forceinline__ void with_form(const Compaction& c, Walk&& walk) {
  if (!c.on) {
    walk(Form<false, false>{});
  } else if (PADS && c.pad) {
    walk(Form<true, PADS>{});
  } else {
    walk(Form<true, false>{});
  }
}

// The compacted slot of row e of the lane (one of ``live``).
__device__ __forceinline__ int slot_of(const Rows4To& o, int e) {
  return o.first + __popc(o.live & ((1u << e) - 1u));
}

// Compacting: the output pointers of the lane's 4 rows at neuron 0 (null: dead row).
__device__ __forceinline__ void rows4_ptrs(const Rows4To& o, float* dst, i64 tstride,
                                           float* p[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int s = slot_of(o, e);
    p[e] = (o.live >> e) & 1u ? dst + (i64)(s >> 5) * tstride + (s & 31) : nullptr;
  }
}

// Compacting epilogue of 4 rows of output j: one store per surviving row.
__device__ __forceinline__ u32 store_rows4_at(float4 acc, int j, const LayerArgs& a,
                                              float* const p[4]) {
  const float4 y = activate4(acc, j, a);
  const float ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (p[e]) store_out(p[e] + (i64)j * 32, ys[e]);
  }
  return alive4(y);
}

// The lane's alive bits (of its 4 rows) as bits of output tiles t0, t0 + 1.
__device__ __forceinline__ u64 alive_at(u32 alive, const Rows4To& o) {
  alive &= o.live;
  const int rel = o.first - o.t0 * 32;
  if (o.live == 0xfu) return (u64)alive << rel;
  u64 bits = 0ull;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if ((alive >> e) & 1u) bits |= 1ull << (rel + __popc(o.live & ((1u << e) - 1u)));
  }
  return bits;
}

// ORs a warp's alive bits (output tiles t0 and t0 + 1) into the layer's mask.
__device__ __forceinline__ void flush_alive(u32* mask, int t0, u64 alive) {
  const u32 lo = __reduce_or_sync(0xffffffffu, (u32)alive);
  const u32 hi = __reduce_or_sync(0xffffffffu, (u32)(alive >> 32));
  if ((threadIdx.x & 31) == 0) {
    if (lo) atomicOr(mask + t0, lo);
    if (hi) atomicOr(mask + t0 + 1, hi);
  }
}

// Compacting: the survivors' image positions move with them (one lane per 4
// rows); the lane of rows 28-31 marks the tile's padding slots (-1).
__device__ __forceinline__ void move_positions(const Compaction& c, const Rows4To& o, int t,
                                               int r4) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if ((o.live >> e) & 1u) c.pos_to[slot_of(o, e)] = c.pos_from[t * 32 + r4 + e];
  }
  if (o.pad && r4 == 28) {
    const int end = o.first + __popc(o.live);
    for (int s = end; s < padded_slots(end); ++s) c.pos_to[s] = -1;
  }
}
