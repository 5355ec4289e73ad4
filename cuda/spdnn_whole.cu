// Every layer of a small network in one launch (small batches of the pruned
// models): a block takes R rows of a tile at a time and keeps them in shared
// memory from the first layer to the last, so only the inputs are read from
// and the last layer's outputs written to global memory, with no launch, no
// plan and no compaction between layers. Each layer is the CSR4 layout of
// layer_csr4 (spdnn_csr4.cuh), summed in the same order with the same
// epilogue, so the outputs are the same bits as one layer a launch.
//
// Rows are not dropped as they die: a dead row stays all zero where the
// engine drops rows (zero in, zero out), so computing it changes nothing. At
// the end the state is what one layer a launch leaves without a compaction
// (gather_results reads it): the last layer's alive bits, each layer's live
// count, the prefix of the survivors over tiles, the buffer in use; the
// layers' timestamps but the last are zero (no per-layer times).
#include "spdnn_csr4.cuh"

// One layer's arguments, in a device array indexed by layer (the host builds it
// with the same field offsets: whole.WHOLE_LAYER_DTYPE).
struct WholeLayer {
  // the outputs in the slots the warps take them from (whole.balanced_spans):
  // (first entry, degree | output << 16); output 0xffff: an empty slot
  const int2* spans;
  const u16* idx;  // input ids, each output's from a multiple of 8
  const float* vals;  // null: the uniform weight ``scale``
  const float* bias_v;  // null: bias_s for every output
  int n_in;
  int n_out;
  float scale;
  float bias_s;
  float floor;
  float clip;
};

// The item's alive bits of one layer (R of them) into the block's word.
__device__ __forceinline__ void or_alive(u32* s_alive, u32 bits) {
  bits = __reduce_or_sync(0xffffffffu, bits);
  if ((threadIdx.x & 31) == 0 && bits) atomicOr(s_alive, bits);
}

// R rows a block item (8: a quarter of a tile, two lanes an output); the
// buffers hold width x R floats each, neuron-major. counts[k]: live rows after
// layer k, summed over the items and set back to zero by the last block.
template <int R>
__global__ void __launch_bounds__(512)
    whole_network(const i64* ptrs, const WholeLayer* __restrict__ layers, int n_layers,
                  int width, int* state, int* live_hist, u64* stamps, int* counts) {
  static_assert(R == 8, "two lanes of 4 rows an output");
  constexpr int ITEMS = 32 / R;  // items a tile
  extern __shared__ float4 whole_sm4[];
  float* xa = reinterpret_cast<float*>(whole_sm4);
  float* xb = xa + width * R;
  __shared__ u32 s_alive[2];  // by layer parity: thread 0 reads and clears one
  const int n_rows = ld_state(state, ST_ROWS);
  const int n_tiles = ld_state(state, ST_TILES);
  const int sel = ld_state(state, ST_SEL);
  const int max_tiles = (int)ptrs[P_MAX_TILES];
  const i64 tstride = ptrs[P_TSTRIDE];
  const float* src = reinterpret_cast<const float*>(ptrs[sel ? P_BUF1 : P_BUF0]);
  float* dst = reinterpret_cast<float*>(ptrs[((sel + n_layers) & 1) ? P_BUF1 : P_BUF0]);
  u32* mask = reinterpret_cast<u32*>(ptrs[P_MASKS]) + ((n_layers - 1) & 1) * max_tiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int half = lane & 1;  // this lane's rows: 4 half .. 4 half + 3 of the item's R
  if (threadIdx.x < 2) s_alive[threadIdx.x] = 0u;
  for (int item = blockIdx.x; item < n_tiles * ITEMS; item += gridDim.x) {
    const int t = item / ITEMS, r0 = (item % ITEMS) * R;
    const u32 valid = (valid_bits(t, n_rows) >> r0) & ((1u << R) - 1u);
    if (!valid) continue;  // the same for the whole block
    const int n_in0 = layers[0].n_in;
    __syncthreads();  // the last item's readers are done with xa
    for (int e = threadIdx.x; e < n_in0 * (R / 4); e += blockDim.x) {
      const int i = e / (R / 4), h = e % (R / 4);
      cp_async16(xa + i * R + h * 4, src + t * tstride + (i64)i * 32 + r0 + h * 4);
    }
    cp_async_wait_all();
    __syncthreads();
    const float* in = xa;
    float* out = xb;
    for (int k = 0; k < n_layers; ++k) {
      const WholeLayer L = layers[k];
      const bool last = k == n_layers - 1;
      float* row_out = dst + t * tstride + r0 + half * 4;
      u32 bits = 0u;
      const int step = nwarps * 16, slots = (L.n_out + step - 1) / step * step;
      for (int s = warp * 16 + (lane >> 1); s < slots; s += step) {
        const int2 sp = __ldg(L.spans + s);
        const int j = (int)((u32)sp.y >> 16), deg = sp.y & 0xffff;
        if (j == 0xffff) continue;
        const uint4* ip = reinterpret_cast<const uint4*>(L.idx) + sp.x / 8;
        const float* xq = in + half * 4;
        float4 acc;
        if (L.vals) {
          acc = csr_rows4_staged<true, R>(ip, reinterpret_cast<const float4*>(L.vals) + sp.x / 4,
                                          deg, xq);
        } else {
          acc = csr_rows4_staged<false, R>(ip, nullptr, deg, xq);
        }
        const float b = L.bias_v ? __ldg(L.bias_v + j) : L.bias_s;
        const float4 y = activate4(acc, L.scale, b, L.floor, L.clip);
        if (last) {
          *reinterpret_cast<float4*>(row_out + (i64)j * 32) = y;
        } else {
          *reinterpret_cast<float4*>(out + j * R + half * 4) = y;
        }
        bits |= (u32)(y.x != 0.0f) | (u32)(y.y != 0.0f) << 1 | (u32)(y.z != 0.0f) << 2 |
                (u32)(y.w != 0.0f) << 3;
      }
      or_alive(&s_alive[k & 1], bits << (half * 4));
      __syncthreads();  // the layer's outputs and alive bits are all in
      if (threadIdx.x == 0) {
        const u32 alive = s_alive[k & 1] & valid;
        s_alive[k & 1] = 0u;  // written again two layers on, after the next sync
        if (alive) {
          atomicAdd(counts + k, __popc(alive));
          if (last) atomicOr(mask + t, alive << r0);
        }
      }
      const float* next_in = out;
      out = const_cast<float*>(in);
      in = next_in;
    }
  }
  if (last_block_done(state)) {
    for (int k = threadIdx.x; k < n_layers; k += blockDim.x) {
      live_hist[k] = __ldcg(counts + k);
      counts[k] = 0;
      if (k < n_layers - 1) stamps[k + 1] = 0ull;
    }
    const int live = tile_prefix<1>(mask, nullptr,
                                    reinterpret_cast<int*>(ptrs[P_TILE_BASE]), n_tiles, n_rows);
    if (threadIdx.x == 0) {
      state[ST_NEW_SLOTS] = live;
      stamps[n_layers] = global_ns();
      held_run_end(state, (sel + n_layers) & 1, live);
      state[ST_DONE] = 0;
    }
  }
}
