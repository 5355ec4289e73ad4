// Row bookkeeping kernels: write sparse input rows into zeroed tiles, and move
// the surviving rows into dense tiles after a layer (compaction), driven by
// the plan that the layer's last block wrote into the device state.
#include "spdnn_common.cuh"

// One warp per row slot s: copy input row rowsel[s] of a CSR block into tile
// s / 32, lane s % 32.  values == null: binary inputs (every entry 1).
template <typename I>
__global__ void scatter_rows(float* buf, i64 tstride, const int* __restrict__ rowsel,
                             int n_active, const i64* __restrict__ indptr,
                             const I* __restrict__ indices, const float* __restrict__ values,
                             int* pos) {
  const int lane = threadIdx.x & 31;
  const int nw = (blockDim.x >> 5) * gridDim.x;
  for (int s = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); s < n_active; s += nw) {
    const int q = rowsel[s];
    if (lane == 0) pos[s] = q;
    float* row = buf + (i64)(s >> 5) * tstride + (s & 31);
    const i64 p1 = indptr[q + 1];
    for (i64 p = indptr[q] + lane; p < p1; p += 32) {
      row[(i64)indices[p] * 32] = values ? values[p] : 1.0f;
    }
  }
}

// Binary inputs as bits: one warp per row slot s sets bit s % 32 of the word of
// each of input row rowsel[s]'s columns in tile s / 32 (a tile's words where its
// floats would start, zeroed before; layer 0 reads them: layer_group_sum).
template <typename I>
__global__ void scatter_bits(u32* words, i64 tstride, const int* __restrict__ rowsel,
                             int n_active, const i64* __restrict__ indptr,
                             const I* __restrict__ indices, int* pos) {
  const int lane = threadIdx.x & 31;
  const int nw = (blockDim.x >> 5) * gridDim.x;
  for (int s = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); s < n_active; s += nw) {
    const int q = rowsel[s];
    if (lane == 0) pos[s] = q;
    u32* tile = words + (i64)(s >> 5) * tstride;
    const u32 bit = 1u << (s & 31);
    const i64 p1 = indptr[q + 1];
    for (i64 p = indptr[q] + lane; p < p1; p += 32) atomicOr(tile + (i64)indices[p], bit);
  }
}

extern "C" __global__ void stamp(u64* stamps, int slot) {
  if (threadIdx.x == 0 && blockIdx.x == 0) stamps[slot] = global_ns();
}

// Move the rows alive after layer k into dense tiles of the spare buffer.
// Does nothing unless the plan asked for it; then the survivors' new slot is
// tile_base[t] + (alive lanes below this one), so order is kept. Launched
// after a layer whose successor does not compact on write (spdnn_layer.cuh),
// and before a merge.
extern "C" __global__ void __launch_bounds__(256)
    compact_rows(const i64* ptrs, int width, int* state, u64* stamps, int k) {
  if (!ld_state(state, ST_DO_COMPACT)) return;  // uniform over the grid
  float* buf0 = reinterpret_cast<float*>(ptrs[P_BUF0]);
  float* buf1 = reinterpret_cast<float*>(ptrs[P_BUF1]);
  int* pos0 = reinterpret_cast<int*>(ptrs[P_POS0]);
  int* pos1 = reinterpret_cast<int*>(ptrs[P_POS1]);
  const u32* masks = reinterpret_cast<const u32*>(ptrs[P_MASKS]);
  const int* tile_base = reinterpret_cast<const int*>(ptrs[P_TILE_BASE]);
  const i64 tstride = ptrs[P_TSTRIDE];
  const int max_tiles = (int)ptrs[P_MAX_TILES];
  const int sel = ld_state(state, ST_SEL);
  const float* src = sel ? buf1 : buf0;  // the layer's output (current)
  float* dst = sel ? buf0 : buf1;
  const int pos_sel = ld_state(state, ST_POS_SEL);
  const int* psrc = pos_sel ? pos1 : pos0;
  int* pdst = pos_sel ? pos0 : pos1;
  const int n_tiles = ld_state(state, ST_TILES);
  const int n_rows = ld_state(state, ST_ROWS);
  const u32* mask = masks + (k & 1) * max_tiles;
  const int lane = threadIdx.x & 31;
  const int per = SPDNN_COMPACT_WARP_NEURONS;
  const int n_chunks = (width + per - 1) / per;
  const i64 n_items = (i64)n_tiles * n_chunks;
  const i64 nw = (i64)(blockDim.x >> 5) * gridDim.x;
  for (i64 w = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); w < n_items; w += nw) {
    const int t = (int)(w / n_chunks), c = (int)(w - (i64)t * n_chunks);
    const u32 m = __ldcg(mask + t) & valid_bits(t, n_rows);
    if (m == 0u) continue;
    const bool alive = (m >> lane) & 1u;
    const int s = __ldcg(tile_base + t) + __popc(m & ((1u << lane) - 1u));
    if (c == 0 && alive) pdst[s] = psrc[t * 32 + lane];
    const float* from = src + t * tstride + lane;
    float* to = dst + (i64)(s >> 5) * tstride + (s & 31);
    const int i0 = c * per, i1 = min(width, i0 + per);
    // 16 loads in flight per lane before their stores (a copy is latency-bound
    // otherwise); dead lanes load nothing.
    for (int i = i0; i < i1; i += 16) {
      float v[16];
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        v[q] = alive && i + q < i1 ? __ldcs(from + (i64)(i + q) * 32) : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        if (alive && i + q < i1) to[(i64)(i + q) * 32] = v[q];
      }
    }
  }
  if (last_block_done(state) && threadIdx.x == 0) {
    const int n_new = state[ST_NEW_ROWS];
    state[ST_ROWS] = n_new;
    state[ST_TILES] = (n_new + 31) / 32;
    state[ST_POS_SEL] = pos_sel ^ 1;
    state[ST_SEL] = sel ^ 1;
    state[ST_DO_COMPACT] = 0;
    state[ST_DID_COMPACT] = 1;
    state[ST_HAS_PAD] = 0;
    state[ST_COMPACTIONS] += 1;
    stamps[k + 1] = global_ns();
    __threadfence();
    state[ST_DONE] = 0;
  }
}

// A batch's results in one array, so the host reads them with one copy:
//   out[0]            rows alive after the last layer run (n_alive)
//   out[1 .. 16]      the state array
//   then              live counts (n_run), stamps (n_run + 1, two words each),
//   then              the survivors' positions (n_alive), in slot order,
//   then (features)   their outputs, width floats each, in the same order.
// Survivors are read from the last layer's mask, ranked by the prefix its plan
// wrote (tile_base); with no layer run, or compacted since, every row held.
extern "C" __global__ void __launch_bounds__(256)
    gather_results(const i64* ptrs, const int* state, const int* live_hist, const u64* stamps,
                   int n_run, int width, int features, int* out) {
  const float* buf = current_features(ptrs, state);
  const int* pos = current_positions(ptrs, state);
  const u32* mask = layer_mask(ptrs, n_run - 1);
  const int* tile_base = reinterpret_cast<const int*>(ptrs[P_TILE_BASE]);
  const i64 tstride = ptrs[P_TSTRIDE];
  const int n_rows = ld_state(state, ST_ROWS);
  const int n_alive = n_run ? live_hist[n_run - 1] : n_rows;
  const int head = 1 + ST_SIZE + n_run + 2 * (n_run + 1);
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  const int nth = blockDim.x * gridDim.x;
  for (int i = tid; i < head; i += nth) {
    int v;
    if (i == 0) {
      v = n_alive;
    } else if (i <= ST_SIZE) {
      v = state[i - 1];
    } else if (i <= ST_SIZE + n_run) {
      v = live_hist[i - 1 - ST_SIZE];
    } else {
      const int w = i - 1 - ST_SIZE - n_run;
      v = (int)(u32)(stamps[w >> 1] >> (32 * (w & 1)));
    }
    out[i] = v;
  }
  int* out_pos = out + head;
  float* out_feat = reinterpret_cast<float*>(out_pos + n_alive);
  const bool dense = n_run == 0 || ld_state(state, ST_DID_COMPACT);  // every row alive
  for (int s = tid; s < n_rows; s += nth) {
    const int t = s >> 5, lane = s & 31;
    int rank = s;
    if (!dense) {
      const u32 m = mask[t] & valid_bits(t, n_rows);
      if (!((m >> lane) & 1u)) continue;
      rank = tile_base[t] + __popc(m & ((1u << lane) - 1u));
    }
    out_pos[rank] = pos[s];
    if (features) {
      const float* row = buf + t * tstride + lane;
      float* to = out_feat + (i64)rank * width;
      for (int i = 0; i < width; ++i) to[i] = row[(i64)i * 32];
    }
  }
}
