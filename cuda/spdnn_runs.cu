// Layers over every tile held, many in one launch. Once the rows have settled
// (few die a layer), a uniform grouped layer over a few thousand rows is a few
// microseconds of gathers from L2, and a launch a layer adds to it the launch,
// the drain between two kernels and the plan its last block makes alone. A run
// of consecutive uniform grouped layers of degree D is one cooperative launch
// over the card (two blocks an SM, all resident), a barrier between two
// layers, and no compaction inside the run: a row that dies in it is computed
// as zeros to the run's end. Block 0 counts each layer's live rows while the
// next layer computes; the last layer's plan (block_plan, exact compactions)
// decides the compaction that compact_rows or the next layer makes. The sums
// are those of layer_group_sum, so a run equals a launch a layer bit for bit.
#include "spdnn_held.cuh"

// Blocks an SM of layers_run_grid at most: its launch bounds, and the grid the
// host launches (held.RUN_BLOCKS_PER_SM).
#define RUN_BLOCKS_PER_SM 2

// Block 0, every thread: the rows alive in ``mask`` (& valid) over the tiles
// held, each word cleared after it is read (the layer after next sets them).
__device__ __forceinline__ int count_and_clear(u32* mask, int n_tiles, int n_rows, int* sh) {
  int c = 0;
  for (int t = threadIdx.x; t < n_tiles; t += blockDim.x) {
    c += __popc(__ldcg(mask + t) & valid_bits(t, n_rows));
    mask[t] = 0u;
  }
  int total;
  block_scan(c, sh, &total);
  return total;
}

// Layers k0 .. k0 + n_layers - 1 over the ST_ROWS rows held in their tiles, the
// rows in place (a compaction the layer before asked for is made before the
// launch); drop_dead: the last layer's plan may compact.
template <int D>
__global__ void __launch_bounds__(SPDNN_HELD_THREADS, RUN_BLOCKS_PER_SM)
    layers_run_grid(const i64* __restrict__ ptrs, const HeldLayer* __restrict__ table, int k0,
                    int n_layers, int drop_dead, int* state, int* live_hist, u64* stamps) {
  static_assert(D % 8 == 0, "degree must be a multiple of 8");
  GridBarrier bar{reinterpret_cast<u32*>(state + ST_DONE), 0u};
  __shared__ int s_scan[32];
  float* const buf0 = reinterpret_cast<float*>(ptrs[P_BUF0]);
  float* const buf1 = reinterpret_cast<float*>(ptrs[P_BUF1]);
  u32* const masks = reinterpret_cast<u32*>(ptrs[P_MASKS]);
  const i64 max_tiles = ptrs[P_MAX_TILES];
  const i64 tstride = ptrs[P_TSTRIDE];
  const int n_rows = ld_state(state, ST_ROWS);
  const int n_tiles = (n_rows + 31) / 32;
  int sel = ld_state(state, ST_SEL);
  const int lane = threadIdx.x & 31, gl = lane >> 3, r4 = (lane & 7) * 4;
  const int warp = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int n_warps = gridDim.x * (blockDim.x >> 5);
  const int thread = blockIdx.x * blockDim.x + threadIdx.x;
  const int n_threads = gridDim.x * blockDim.x;
  HeldLayer L = table[k0];
  HeldLayer next = n_layers > 1 ? table[k0 + 1] : L;
  if (n_layers > 1) prefetch_ids<D>(next, run_inputs(next, false), thread, n_threads);
  for (int j = 0; j < n_layers; ++j) {
    const int k = k0 + j;
    const bool grouped = stores_groups(L, next, j + 1 == n_layers);
    const u16* in = run_inputs(L, j == 0);
    u32* const mask = masks + (k & 1) * max_tiles;
    if (blockIdx.x == 0) {  // layer k - 1's count (its plan made the first one)
      const int live = count_and_clear(masks + ((k + 1) & 1) * max_tiles, n_tiles, n_rows,
                                       s_scan);
      if (j > 0 && threadIdx.x == 0) live_hist[k - 1] = live;
    }
    const float* src = sel ? buf1 : buf0;
    float* dst = sel ? buf0 : buf1;
    const int steps = L.n_groups / 4;  // a warp step: 4 groups of 8 lanes (32 rows)
    const i64 units = (i64)n_tiles * steps;
    for (i64 u = warp; u < units; u += n_warps) {
      const int t = (int)(u / steps);
      const int g = (int)(u - (i64)t * steps) * 4 + gl;
      GroupIds<D> ids;
      load_group_ids<D>(L, in, g, ids);
      const i64 at = (i64)t * tstride;
      const u32 alive = __reduce_or_sync(
          0xffffffffu, held_group<D>(L, ids, src + at + r4, dst + at, r4, g, grouped));
      if (lane == 0 && alive) atomicOr(mask + t, alive);
    }
    bar.arrive();
    if (j + 1 < n_layers) {  // while waiting: the next layer's arguments, ids into L2
      L = next;
      if (j + 2 < n_layers) next = table[k + 2];
    }
    if (j + 2 < n_layers) prefetch_ids<D>(next, run_inputs(next, false), thread, n_threads);
    bar.wait();  // layer k is written everywhere: its outputs, its alive bits
    if (j + 1 < n_layers && blockIdx.x == 0 && threadIdx.x == 0) stamps[k + 1] = global_ns();
    sel ^= 1;
  }
  if (blockIdx.x == 0) {  // the last layer's plan, as a launch of it alone makes it
    const int last = k0 + n_layers - 1;
    if (threadIdx.x == 0) state[ST_SEL] = sel ^ 1;  // the plan flips it to the output
    block_plan<false>(state, masks + (last & 1) * max_tiles,
                      masks + ((last + 1) & 1) * max_tiles,
                      reinterpret_cast<int*>(ptrs[P_TILE_BASE]), (int)max_tiles, live_hist,
                      stamps, last, drop_dead, false, false, L.n_out, false);
  }
  bar.done();
}
