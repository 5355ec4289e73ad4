// Converged layers in one launch. Once the compressed rows fit one tile
// (at most 32 rows held), a uniform grouped layer is a few microseconds of
// gathers, and its launch and the drain between two kernels cost more than
// that. A run of consecutive uniform grouped layers of degree D is one launch,
// which also does each layer's bookkeeping as block_plan does with one tile
// and no compaction: the live count, the timestamp, the masks' parities and
// the buffer in use. Two forms (held.py picks one by width):
// - layers_held_row: one block a row held, its features in shared memory for
//   the whole run, so blocks never wait for each other;
// - layers_held_grid: one block an SM of the whole card (a cooperative launch,
//   so all are resident) walks the layers over the rows held (8, 16 or 32),
//   with a barrier in global memory between two layers.
// A layer's sums are those of layer_group_sum (the same adds in the same
// order), so either form equals a launch a layer bit for bit. Inside a run, a
// layer with one bias whose next layer has group ids of it (gidx_grp) stores
// one value a group instead of the same value in its 16 slots, and the next
// layer gathers those: a sixteenth of the stores, from a smaller array.
#include "spdnn_held.cuh"

// Layers k0 .. k0 + n_layers - 1 on the held_rows (8, 16 or 32) rows held in
// tile 0 (ST_ROWS <= held_rows), one block an SM of SPDNN_HELD_THREADS threads at
// most, launched cooperatively. What does not depend on a layer's inputs (its
// arguments, a warp's first group ids, the next layer's ids into L2) is loaded
// while the blocks wait for each other, and the lead thread's bookkeeping of
// layer k lands in layer k + 1, off the barrier's path.
template <int D>
__global__ void __launch_bounds__(SPDNN_HELD_THREADS, 1)
    layers_held_grid(const i64* __restrict__ ptrs, const HeldLayer* __restrict__ table, int k0,
                     int n_layers, int held_rows, int* state, int* live_hist, u64* stamps) {
  GridBarrier bar{reinterpret_cast<u32*>(state + ST_DONE), 0u};
  static_assert(D % 8 == 0, "degree must be a multiple of 8");
  const int lpg_log2 = held_rows == 8 ? 1 : held_rows == 16 ? 2 : 3;  // lanes a group: 2, 4, 8
  const int gpw = 32 >> lpg_log2;  // groups a warp step
  __shared__ u32 s_alive[2];  // this block's alive bits, by layer parity
  float* const buf0 = reinterpret_cast<float*>(ptrs[P_BUF0]);
  float* const buf1 = reinterpret_cast<float*>(ptrs[P_BUF1]);
  u32* const masks = reinterpret_cast<u32*>(ptrs[P_MASKS]);
  const i64 max_tiles = ptrs[P_MAX_TILES];
  const int rank = blockIdx.x, n_blocks = gridDim.x;
  const bool lead = rank == 0 && threadIdx.x == 0;  // does the layers' bookkeeping
  const int n_rows = ld_state(state, ST_ROWS);
  const u32 valid = valid_bits(0, n_rows);
  int sel = ld_state(state, ST_SEL);
  const int lane = threadIdx.x & 31;
  const int gl = lane >> lpg_log2, r4 = (lane & ((1 << lpg_log2) - 1)) * 4;
  const bool gather = r4 < n_rows;  // some of this lane's rows are held
  const int warp = rank * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int n_warps = n_blocks * (blockDim.x >> 5);
  const int thread = rank * blockDim.x + threadIdx.x;
  const int n_threads = n_blocks * blockDim.x;
  if (threadIdx.x < 2) s_alive[threadIdx.x] = 0u;
  HeldLayer L = table[k0];
  HeldLayer next = n_layers > 1 ? table[k0 + 1] : L;
  GroupIds<D> first;  // this warp's first group of layer k, loaded ahead
  if (warp * gpw + gl < L.n_groups) load_group_ids<D>(L, L.gidx, warp * gpw + gl, first);
  if (n_layers > 1) prefetch_ids<D>(next, run_inputs(next, false), thread, n_threads);  // L2
  __syncthreads();
  for (int j = 0; j < n_layers; ++j) {
    const int k = k0 + j;
    const bool grouped = stores_groups(L, next, j + 1 == n_layers);
    const u16* in = run_inputs(L, j == 0);
    u32* const other = masks + ((k + 1) & 1) * max_tiles;  // layer k - 1's bits
    u32 prev = 0u;
    if (lead && j > 0) prev = __ldcg(other);
    const float* src = sel ? buf1 : buf0;
    float* dst = sel ? buf0 : buf1;
    u32 alive = 0u;
    const int steps = (L.n_groups + gpw - 1) / gpw;
    for (int s = warp; s < steps; s += n_warps) {
      const int g = s * gpw + gl;
      if (g >= L.n_groups) continue;
      if (s == warp) {
        alive |= held_group<D>(L, first, src + r4, dst, r4, g, grouped, gather);
      } else {
        GroupIds<D> ids;
        load_group_ids<D>(L, in, g, ids);
        alive |= held_group<D>(L, ids, src + r4, dst, r4, g, grouped, gather);
      }
    }
    alive = __reduce_or_sync(0xffffffffu, alive);
    if (lane == 0 && alive) atomicOr(&s_alive[j & 1], alive);
    if (lead) {
      if (j > 0) live_hist[k - 1] = __popc(prev & valid);
      *other = 0u;  // cleared for layer k + 1, which sets it after the barrier
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const u32 bits = s_alive[j & 1];
      if (bits) atomicOr(masks + (k & 1) * max_tiles, bits);
      s_alive[(j + 1) & 1] = 0u;
    }
    bar.arrive();
    if (j + 1 < n_layers) {  // while waiting: the next layer's arguments and first ids
      L = next;
      if (j + 2 < n_layers) next = table[k + 2];
      if (warp * gpw + gl < L.n_groups) {
        load_group_ids<D>(L, run_inputs(L, false), warp * gpw + gl, first);
      }
    }
    if (j + 2 < n_layers) prefetch_ids<D>(next, run_inputs(next, false), thread, n_threads);
    bar.wait();  // layer k is written everywhere: its outputs, its alive bits
    if (lead) stamps[k + 1] = global_ns();
    sel ^= 1;
  }
  if (lead) {  // the last layer's count, and the state block_plan leaves
    const int last = k0 + n_layers - 1;
    const int live = __popc(__ldcg(masks + (last & 1) * max_tiles) & valid);
    live_hist[last] = live;
    held_run_end(state, sel, live);
  }
  bar.done();
}

// One row held's sum of group g (the adds of layer_group_sum, in its order) and
// each used slot's epilogue (once where the layer has one bias; with ``grouped``
// stored once, at y[g]), features x and y in shared memory; whether an output is
// nonzero.
template <int D>
__device__ __forceinline__ bool row_group(const HeldLayer& L, const GroupIds<D>& ids,
                                          const float* x, float* y, int g, bool grouped) {
  float acc = 0.0f;
#pragma unroll
  for (int q = 0; q < D / 8; ++q) {
    const u32 w[4] = {ids.in[q].x, ids.in[q].y, ids.in[q].z, ids.in[q].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc += x[w[e] & 0xffffu];
      acc += x[w[e] >> 16];
    }
  }
  if (!L.bias_v) {  // one bias: every slot of the group holds the same value
    const float v = activate(acc, L.scale, L.bias_s, L.floor, L.clip);
    if (grouped) {
      y[g] = v;
      return each_output<D>(ids, [](int) {}) && v != 0.0f;
    }
    return each_output<D>(ids, [&](int id) { y[id] = v; }) && v != 0.0f;
  }
  bool alive = false;
  each_output<D>(ids, [&](int id) {
    const float v = activate(acc, L.scale, __ldg(L.bias_v + id), L.floor, L.clip);
    y[id] = v;
    alive |= v != 0.0f;
  });
  return alive;
}

// Layers k0 .. k0 + n_layers - 1, one block a row held (block r: row r of tile 0;
// blocks at or past ST_ROWS only count themselves out). Rows never meet, so a
// row's features stay in the block's shared memory (two buffers of width floats)
// for the whole run and a layer waits only for its own block: no barrier between
// blocks. Each block streams every layer's group ids (L2 serves all but the
// first): a thread's first group of layer k + 1 is loaded while layer k computes,
// the layers' arguments two layers ahead, their ids into L2 two layers ahead. A
// row's alive bit a layer goes to live_bits (n_layers bits a row); the last block
// out counts them into live_hist and leaves the state block_plan would.
template <int D>
__global__ void __launch_bounds__(SPDNN_HELD_ROW_THREADS, 1)
    layers_held_row(const i64* __restrict__ ptrs, const HeldLayer* __restrict__ table, int k0,
                    int n_layers, int width, int* state, int* live_hist, u64* stamps,
                    u32* live_bits) {
  static_assert(D % 8 == 0, "degree must be a multiple of 8");
  extern __shared__ float s_rows[];
  const int r = blockIdx.x;
  const int rows = ld_state(state, ST_ROWS);
  const int sel = ld_state(state, ST_SEL);
  const int words = (n_layers + 31) / 32;  // of live_bits a row
  const int last = k0 + n_layers - 1;
  float* const buf0 = reinterpret_cast<float*>(ptrs[P_BUF0]);
  float* const buf1 = reinterpret_cast<float*>(ptrs[P_BUF1]);
  if (r < rows) {
    float* x = s_rows;
    float* y = s_rows + width;
    // layers k, k + 1 and k + 2
    HeldLayer L = table[k0];
    HeldLayer next = n_layers > 1 ? table[k0 + 1] : L;
    HeldLayer after = n_layers > 2 ? table[k0 + 2] : next;
    const float* src = sel ? buf1 : buf0;
    for (int i = threadIdx.x; i < L.n_in; i += blockDim.x) x[i] = __ldcg(src + (i64)i * 32 + r);
    const int g0 = threadIdx.x;
    const int thread = r * blockDim.x + threadIdx.x, n_threads = gridDim.x * blockDim.x;
    GroupIds<D> ids;  // this thread's first group of layer k
    if (g0 < L.n_groups) load_group_ids<D>(L, L.gidx, g0, ids);
    if (n_layers > 1) prefetch_ids<D>(next, run_inputs(next, false), thread, n_threads);
    __syncthreads();
    u32 bits = 0u;  // thread 0: this row's alive bits of up to 32 layers
    for (int j = 0; j < n_layers; ++j) {
      const int k = k0 + j;
      GroupIds<D> ids_next;  // layer k + 1's, in flight while layer k computes
      if (j + 1 < n_layers && g0 < next.n_groups) {
        load_group_ids<D>(next, run_inputs(next, false), g0, ids_next);
      }
      if (j + 2 < n_layers) prefetch_ids<D>(after, run_inputs(after, false), thread, n_threads);
      const HeldLayer later = j + 3 < n_layers ? table[k + 3] : after;
      const bool grouped = stores_groups(L, next, k == last);
      bool alive = false;
      for (int g = g0; g < L.n_groups; g += blockDim.x) {
        if (g == g0) {
          alive |= row_group<D>(L, ids, x, y, g, grouped);
        } else {
          GroupIds<D> more;
          load_group_ids<D>(L, run_inputs(L, j == 0), g, more);
          alive |= row_group<D>(L, more, x, y, g, grouped);
        }
      }
      alive = __syncthreads_or(alive);
      if (threadIdx.x == 0) {
        bits |= (u32)alive << (j & 31);
        if ((j & 31) == 31 || k == last) {
          live_bits[r * words + j / 32] = bits;
          bits = 0u;
        }
        if (r == 0) stamps[k + 1] = global_ns();
      }
      if (k < last) {
        L = next;
        next = after;
        after = later;
        ids = ids_next;
      }
      float* const t = x;
      x = y;
      y = t;
    }
    float* dst = ((sel ^ n_layers) & 1) ? buf1 : buf0;  // the buffer the state will name
    for (int i = threadIdx.x; i < L.n_out; i += blockDim.x) dst[(i64)i * 32 + r] = x[i];
  }
  if (!last_block_done(state)) return;
  for (int j = threadIdx.x; j < n_layers; j += blockDim.x) {
    int live = 0;
    for (int q = 0; q < rows; ++q) {
      live += (__ldcg(live_bits + q * words + j / 32) >> (j & 31)) & 1u;
    }
    live_hist[k0 + j] = live;
  }
  if (threadIdx.x == 0) {
    u32 alive = 0u;  // the rows alive after the last layer, as bits of the tile
    for (int q = 0; q < rows; ++q) {
      alive |= ((__ldcg(live_bits + q * words + (n_layers - 1) / 32) >> ((n_layers - 1) & 31)) & 1u)
               << q;
    }
    u32* const masks = reinterpret_cast<u32*>(ptrs[P_MASKS]);
    const i64 max_tiles = ptrs[P_MAX_TILES];
    masks[((last + 1) & 1) * max_tiles] = 0u;  // as the layer after it expects
    masks[(last & 1) * max_tiles] = alive;
    stamps[last + 1] = global_ns();
    state[ST_DONE] = 0;
    held_run_end(state, (sel ^ n_layers) & 1, __popc(alive));
  }
}

// The group ids the held forms read (HeldLayer::gidx_grp), made once when the
// network is loaded, for the layers listed (blockIdx.y picks one, layers[i]) in
// two launches: held_group_of notes, for each output of the layer before, the
// group that computes it (owner, width u16 a listed layer); held_group_inputs
// then writes each input id of the listed layer as that group.
extern "C" __global__ void held_group_of(const HeldLayer* __restrict__ table,
                                         const int* __restrict__ layers, int width, u16* owner) {
  const HeldLayer P = table[layers[blockIdx.y] - 1];
  u16* own = owner + (i64)blockIdx.y * width;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < P.n_groups * 16;
       e += gridDim.x * blockDim.x) {
    const int id = __ldg(P.gout + e);
    if (id >= 0) own[id] = (u16)(e >> 4);
  }
}

extern "C" __global__ void held_group_inputs(const HeldLayer* __restrict__ table,
                                             const int* __restrict__ layers,
                                             const int* __restrict__ entries, int width,
                                             const u16* __restrict__ owner) {
  const HeldLayer L = table[layers[blockIdx.y]];
  const u16* own = owner + (i64)blockIdx.y * width;
  u16* to = const_cast<u16*>(L.gidx_grp);
  const int n = entries[blockIdx.y];
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
    to[e] = own[__ldg(L.gidx + e)];
  }
}
