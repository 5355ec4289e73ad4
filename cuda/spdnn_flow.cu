// Converged layers over the card without a barrier a layer. layers_held_grid
// passes a grid barrier between two layers: a release by every block, a
// counter in L2 and an acquire poll (a converged layer at 16384 wide: 2.1 us
// so, 1.6-1.7 us here; H100, 2026-12-08). Here a layer's group values go to a ring of slots as 64-bit
// words, the value in the low half and a tag naming the layer in the high half
// (one store, never torn), and a lane reading its inputs polls those words
// until each carries the tag of the layer before: it waits only for the groups
// it reads, as soon as they are written, with no fence on either side.
//
// A slot is written again FLOW_RING layers later; a grid barrier every
// FLOW_SPAN layers (half the ring) keeps every reader of a slot ahead of its
// next writer. Tags come from a counter kept beside the ring (never reset
// while the ring lives), so no word a former launch left can pass for one of
// this launch.
//
// The sums are layers_held_grid's (each row's adds in layer_group_sum's
// order), so a run equals a launch a layer bit for bit. A run flows where every
// layer before its last stores one value a group (one bias, and the next layer
// has group ids of it: held.py); the first layer reads the rows as they came,
// the last stores each output slot where the state names the features.
#include "spdnn_held.cuh"

// Layers between two grid barriers, and the ring's slots (a layer's group
// values each): twice that, so a slot's readers are past a barrier before the
// slot is written again.
#define FLOW_SPAN 16
#define FLOW_RING (2 * FLOW_SPAN)
// Words of the flow's scratch before the alive bits: the tag counter, alone on
// its line.
#define FLOW_HEAD 32

// Two rows of one input from the ring: their values if both carry ``tag``.
__device__ __forceinline__ bool ld_tagged2(const u64* p, u32 tag, float2& x) {
  u64 a, b;
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(a), "=l"(b)
               : "l"(p)
               : "memory");
  x = make_float2(__uint_as_float((u32)a), __uint_as_float((u32)b));
  return (u32)(a >> 32) == tag && (u32)(b >> 32) == tag;
}

__device__ __forceinline__ void st_tagged2(u64* p, u32 tag, float2 y) {
  const u64 a = (u64)tag << 32 | __float_as_uint(y.x);
  const u64 b = (u64)tag << 32 | __float_as_uint(y.y);
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b)
               : "memory");
}

// Group g's input ids of a run's later layer (gidx_grp) and its output ids, into L1.
template <int D>
__device__ __forceinline__ void prefetch_group_ids_l1(const HeldLayer& L, int g) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(L.gidx_grp + (i64)g * D));
  asm volatile("prefetch.global.L1 [%0];" ::"l"(L.gout + (i64)g * 16));
}

// Two rows' sums of one group (ids.in: its D input ids), each row's adds in
// layer_group_sum's order. load(id, x) reads input id's two rows into x and
// says whether they are ready; every input is read again until all are.
template <int D, class Load>
__device__ __forceinline__ float2 sum_rows2(const uint4 (&iv)[D / 8], Load load) {
  float2 x[D];
  bool ready;
  do {
    ready = true;
#pragma unroll
    for (int p = 0; p < D; p += 2) {
      const u32 w = (&iv[p / 8].x)[(p % 8) / 2];
      ready &= load(w & 0xffffu, x[p]);
      ready &= load(w >> 16, x[p + 1]);
    }
  } while (!ready);
  float2 acc = make_float2(0.0f, 0.0f);
#pragma unroll
  for (int p = 0; p < D; ++p) {
    acc.x += x[p].x;
    acc.y += x[p].y;
  }
  return acc;
}

__device__ __forceinline__ float2 activate2(float2 acc, float scale, float b, float floor,
                                            float clip) {
  return make_float2(activate(acc.x, scale, b, floor, clip),
                     activate(acc.y, scale, b, floor, clip));
}

__device__ __forceinline__ u32 alive2(float2 y) {
  return (u32)(y.x != 0.0f) | (u32)(y.y != 0.0f) << 1;
}

// Layers k0 .. k0 + n_layers - 1 on the held_rows (8, 16 or 32) rows held in
// tile 0, one block an SM (a cooperative launch: every block resident, so a
// lane polling its inputs never waits on a block that cannot run). A lane
// takes two rows of a group (held_rows / 2 lanes a group). ring: FLOW_RING
// slots of ring_groups x 32 words; flow: the tag counter (word 0), then a
// word of alive bits a layer of the run (zero between launches).
template <int D>
__global__ void __launch_bounds__(SPDNN_HELD_THREADS, 1)
    layers_held_flow(const i64* __restrict__ ptrs, const HeldLayer* __restrict__ table, int k0,
                     int n_layers, int held_rows, int* state, int* live_hist, u64* stamps,
                     u64* ring, int ring_groups, u32* flow) {
  static_assert(D % 8 == 0, "degree must be a multiple of 8");
  GridBarrier bar{reinterpret_cast<u32*>(state + ST_DONE), 0u};
  const int lpg_log2 = held_rows == 8 ? 2 : held_rows == 16 ? 3 : 4;  // lanes a group: 4, 8, 16
  const int gpw = 32 >> lpg_log2;  // groups a warp step
  const int sel = ld_state(state, ST_SEL);
  const float* const src = reinterpret_cast<const float*>(ptrs[sel ? P_BUF1 : P_BUF0]);
  float* const dst = reinterpret_cast<float*>(ptrs[((sel ^ n_layers) & 1) ? P_BUF1 : P_BUF0]);
  const int n_rows = ld_state(state, ST_ROWS);
  const u32 base = __ldcg(flow);  // this launch's tags: base + 1 + j
  u32* const alive_words = flow + FLOW_HEAD;
  const i64 slot_words = (i64)ring_groups * 32;
  const int lane = threadIdx.x & 31;
  const int gl = lane >> lpg_log2, r2 = (lane & ((1 << lpg_log2) - 1)) * 2;
  const bool gather = r2 < n_rows;  // some of this lane's rows are held
  const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int n_warps = gridDim.x * (blockDim.x >> 5);
  const int thread = blockIdx.x * blockDim.x + threadIdx.x;
  const int n_threads = gridDim.x * blockDim.x;
  const bool lead = thread == 0;  // stamps each layer as its first warp ends it
  HeldLayer L = table[k0];
  HeldLayer next = n_layers > 1 ? table[k0 + 1] : L;
  GroupIds<D> first;  // this warp's first group of layer k, loaded ahead
  if (warp * gpw + gl < L.n_groups) load_group_ids<D>(L, L.gidx, warp * gpw + gl, first);
  if (n_layers > 1) prefetch_ids<D>(next, next.gidx_grp, thread, n_threads);
  for (int j = 0; j < n_layers; ++j) {
    const int k = k0 + j;
    const bool last = j + 1 == n_layers;
    const u16* in = j == 0 ? L.gidx : L.gidx_grp;
    const u64* from = ring + (i64)((j + FLOW_RING - 1) % FLOW_RING) * slot_words + r2;
    u64* const to = ring + (i64)(j % FLOW_RING) * slot_words + r2;
    const u32 tag_in = base + j, tag_out = base + 1 + j;
    // this warp's first group of layer k + 1 into L1 (loaded once this layer is done)
    const int g_first = warp * gpw + gl;
    if (!last && g_first < next.n_groups) prefetch_group_ids_l1<D>(next, g_first);
    const HeldLayer after = j + 2 < n_layers ? table[k + 2] : next;
    if (j + 2 < n_layers) prefetch_ids<D>(after, after.gidx_grp, thread, n_threads);
    u32 alive = 0u;
    const int steps = (L.n_groups + gpw - 1) / gpw;
    for (int s = warp; s < steps; s += n_warps) {
      const int g = s * gpw + gl;
      if (g >= L.n_groups) continue;
      GroupIds<D> ids = first;
      if (s != warp) load_group_ids<D>(L, in, g, ids);
      const bool used = each_output<D>(ids, [](int) {});
      float2 acc = make_float2(0.0f, 0.0f);  // stands in for rows never read
      if (gather && j == 0) {
        acc = sum_rows2<D>(ids.in, [&](u32 id, float2& x) {
          x = __ldcg(reinterpret_cast<const float2*>(src + (i64)id * 32 + r2));
          return true;
        });
      } else if (gather) {
        acc = sum_rows2<D>(ids.in, [&](u32 id, float2& x) {
          return ld_tagged2(from + (i64)id * 32, tag_in, x);
        });
      }
      if (!last) {  // one bias (held.py): the group's value, where the next layer reads it
        const float2 y = activate2(acc, L.scale, L.bias_s, L.floor, L.clip);
        if (gather) st_tagged2(to + (i64)g * 32, tag_out, y);
        if (used) alive |= alive2(y) << r2;
        continue;
      }
      // the last layer: each used slot where the state names the features; the
      // output ids again (from L1), so they hold no registers while inputs load
      load_group_ids<D>(L, in, g, ids);
      if (!L.bias_v) {
        const float2 y = activate2(acc, L.scale, L.bias_s, L.floor, L.clip);
        if (each_output<D>(ids, [&](int id) {
              *reinterpret_cast<float2*>(dst + (i64)id * 32 + r2) = y;
            })) {
          alive |= alive2(y) << r2;
        }
      } else {
        each_output<D>(ids, [&](int id) {
          const float2 y = activate2(acc, L.scale, __ldg(L.bias_v + id), L.floor, L.clip);
          *reinterpret_cast<float2*>(dst + (i64)id * 32 + r2) = y;
          alive |= alive2(y) << r2;
        });
      }
    }
    alive = __reduce_or_sync(0xffffffffu, alive);
    if (lane == 0 && alive) atomicOr(alive_words + j, alive);
    if (lead) stamps[k + 1] = global_ns();
    if (!last) {
      L = next;
      next = after;
      if (g_first < L.n_groups) load_group_ids<D>(L, L.gidx_grp, g_first, first);
      if ((j + 1) % FLOW_SPAN == 0) {  // the ring's slots of FLOW_SPAN layers ago are read
        bar.arrive();
        bar.wait();
      }
    }
  }
  // the last block out: each layer's live count, the last layer's alive bits, the
  // tags of the next launch, and the state block_plan leaves
  __shared__ bool s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    s_last = atomicAdd(reinterpret_cast<u32*>(state + ST_DONE), 1u) == bar.passed + gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const u32 valid = valid_bits(0, n_rows);
  const int last = k0 + n_layers - 1;
  for (int j = threadIdx.x; j < n_layers; j += blockDim.x) {
    const u32 bits = __ldcg(alive_words + j) & valid;
    alive_words[j] = 0u;
    live_hist[k0 + j] = __popc(bits);
    if (j + 1 < n_layers) continue;
    u32* const masks = reinterpret_cast<u32*>(ptrs[P_MASKS]);
    const i64 max_tiles = ptrs[P_MAX_TILES];
    masks[((last + 1) & 1) * max_tiles] = 0u;  // as the layer after it expects
    masks[(last & 1) * max_tiles] = bits;
    stamps[last + 1] = global_ns();
    flow[0] = base + n_layers;
    state[ST_DONE] = 0;
    held_run_end(state, (sel ^ n_layers) & 1, __popc(bits));
  }
}
