// Converged layers in one launch. Once the compressed rows fit one tile
// (at most 32 rows held), a uniform grouped layer is a few microseconds of
// gathers, and its launch and the drain between two kernels cost more than
// that. layers_held_sum runs a run of consecutive uniform grouped layers of
// degree D in one launch: a cluster of blocks (sm_90; one block before) walks
// the layers with a cluster barrier between two, and does each layer's
// bookkeeping as block_plan does with one tile and no compaction: the live
// count, the timestamp, the masks' parities and the buffer in use.
//
// A layer's sums are those of layer_group_sum (the same adds in the same
// order), over the rows held only (8, 16 or 32): rows / 4 lanes a group, 4 rows
// a lane; the rows held are an argument, so a degree is one instantiation.
// Features written in one layer are read by other blocks in the next, so they
// are loaded through L2 (ld.global.cg), never through the read-only path.
#include "spdnn_layer.cuh"

// One layer's arguments, in a device array indexed by layer (the host builds
// it with the same field offsets: held.HELD_LAYER_DTYPE).
struct HeldLayer {
  const u16* gidx;  // n_groups x D input ids
  const int* gout;  // n_groups x 16 output ids (-1: unused slot)
  const float* bias_v;  // null: bias_s for every output
  int n_groups;  // a multiple of 4
  int n_out;
  float scale;
  float bias_s;
  float floor;
  float clip;
};

#if __CUDA_ARCH__ >= 900
#define HELD_CLUSTER_DIMS __cluster_dims__(SPDNN_HELD_CLUSTER, 1, 1)
#else
#define HELD_CLUSTER_DIMS
#endif

// The blocks' barrier, in two halves: no block passes held_wait before every
// block reached held_arrive, and the writes before held_arrive are seen after
// held_wait (release / acquire at cluster scope).
__device__ __forceinline__ void held_arrive() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void held_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
  __syncthreads();
#endif
}

__device__ __forceinline__ int held_rank() {
#if __CUDA_ARCH__ >= 900
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
#else
  return 0;
#endif
}

__device__ __forceinline__ int held_blocks() {
#if __CUDA_ARCH__ >= 900
  u32 n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return (int)n;
#else
  return 1;
#endif
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// A layer's input ids into L2, 128 bytes a thread of the launch.
template <int D>
__device__ __forceinline__ void prefetch_ids(const HeldLayer& L, int thread, int n_threads) {
  const char* ids = reinterpret_cast<const char*>(L.gidx);
  const i64 bytes = (i64)L.n_groups * D * 2;
  for (i64 at = (i64)thread * 128; at < bytes; at += (i64)n_threads * 128) {
    prefetch_l2(ids + at);
  }
}

// A group's input ids (D / 8 uint4) and output ids (4 int4) in registers.
template <int D>
struct GroupIds {
  uint4 in[D / 8];
  int4 out[4];
};

template <int D>
__device__ __forceinline__ void load_group_ids(const HeldLayer& L, int g, GroupIds<D>& ids) {
  const uint4* ip = reinterpret_cast<const uint4*>(L.gidx) + (i64)g * (D / 8);
  const int4* op = reinterpret_cast<const int4*>(L.gout) + (i64)g * 4;
#pragma unroll
  for (int q = 0; q < D / 8; ++q) ids.in[q] = __ldg(ip + q);
#pragma unroll
  for (int q = 0; q < 4; ++q) ids.out[q] = __ldg(op + q);
}

// One group on this lane's 4 rows (xq: the rows' neuron 0 of the input tile): the
// sum of layer_group_sum, then each used slot's epilogue stored at dst; returns
// the rows' alive bits as bits of the tile.
template <int D>
__device__ __forceinline__ u32 held_group(const HeldLayer& L, const GroupIds<D>& ids,
                                          const float* xq, float* dst, int r4) {
  constexpr int B = D < SPDNN_HELD_BATCH ? D : SPDNN_HELD_BATCH;
  // the order and rounding of layer_group_sum; written by other blocks: through L2
  const float4 acc = sum_rows4<D, B>(ids.in, xq, [](const float* p) {
    return __ldcg(reinterpret_cast<const float4*>(p));
  });
  u32 alive = 0u;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int out[4] = {ids.out[q].x, ids.out[q].y, ids.out[q].z, ids.out[q].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int id = out[e];
      if (id < 0) continue;
      const float b = L.bias_v ? __ldg(L.bias_v + id) : L.bias_s;
      const float4 y = activate4(acc, L.scale, b, L.floor, L.clip);
      *reinterpret_cast<float4*>(dst + (i64)id * 32 + r4) = y;
      alive |= alive4(y) << r4;
    }
  }
  return alive;
}

// Layers k0 .. k0 + n_layers - 1 on the held_rows (8, 16 or 32) rows held in
// tile 0 (ST_ROWS <= held_rows).
// The grid is one cluster; a block of SPDNN_HELD_THREADS threads. What does not
// depend on a layer's inputs (its arguments, a warp's first group ids, the next
// layer's ids into L2) is loaded while the blocks wait for each other, and the
// lead thread's bookkeeping of layer k lands in layer k + 1, off the barrier's path.
template <int D>
__global__ void __launch_bounds__(SPDNN_HELD_THREADS, 1) HELD_CLUSTER_DIMS
    layers_held_sum(const i64* __restrict__ ptrs, const HeldLayer* __restrict__ table, int k0,
                    int n_layers, int held_rows, int* state, int* live_hist, u64* stamps) {
  static_assert(D % 8 == 0, "degree must be a multiple of 8");
  const int lpg_log2 = held_rows == 8 ? 1 : held_rows == 16 ? 2 : 3;  // lanes a group: 2, 4, 8
  const int gpw = 32 >> lpg_log2;  // groups a warp step
  __shared__ u32 s_alive[2];  // this block's alive bits, by layer parity
  float* const buf0 = reinterpret_cast<float*>(ptrs[P_BUF0]);
  float* const buf1 = reinterpret_cast<float*>(ptrs[P_BUF1]);
  u32* const masks = reinterpret_cast<u32*>(ptrs[P_MASKS]);
  const i64 max_tiles = ptrs[P_MAX_TILES];
  const int rank = held_rank(), n_blocks = held_blocks();
  const bool lead = rank == 0 && threadIdx.x == 0;  // does the layers' bookkeeping
  const u32 valid = valid_bits(0, ld_state(state, ST_ROWS));
  int sel = ld_state(state, ST_SEL);
  const int lane = threadIdx.x & 31;
  const int gl = lane >> lpg_log2, r4 = (lane & ((1 << lpg_log2) - 1)) * 4;
  const int warp = rank * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int n_warps = n_blocks * (blockDim.x >> 5);
  const int thread = rank * blockDim.x + threadIdx.x;
  const int n_threads = n_blocks * blockDim.x;
  if (threadIdx.x < 2) s_alive[threadIdx.x] = 0u;
  HeldLayer L = table[k0];
  GroupIds<D> first;  // this warp's first group of layer k, loaded ahead
  if (warp * gpw + gl < L.n_groups) load_group_ids<D>(L, warp * gpw + gl, first);
  if (n_layers > 1) prefetch_ids<D>(table[k0 + 1], thread, n_threads);  // into L2
  __syncthreads();
  for (int j = 0; j < n_layers; ++j) {
    const int k = k0 + j;
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
        alive |= held_group<D>(L, first, src + r4, dst, r4);
      } else {
        GroupIds<D> ids;
        load_group_ids<D>(L, g, ids);
        alive |= held_group<D>(L, ids, src + r4, dst, r4);
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
    held_arrive();
    if (j + 1 < n_layers) {  // while waiting: the next layer's arguments and first ids
      L = table[k + 1];
      if (warp * gpw + gl < L.n_groups) load_group_ids<D>(L, warp * gpw + gl, first);
    }
    if (j + 2 < n_layers) prefetch_ids<D>(table[k + 2], thread, n_threads);  // into L2
    held_wait();  // layer k is written everywhere: its outputs, its alive bits
    if (lead) stamps[k + 1] = global_ns();
    sel ^= 1;
  }
  if (lead) {  // the last layer's count, and the state block_plan leaves
    const int last = k0 + n_layers - 1;
    const int live = __popc(__ldcg(masks + (last & 1) * max_tiles) & valid);
    live_hist[last] = live;
    state[ST_SEL] = sel;
    state[ST_NEW_ROWS] = live;
    state[ST_DO_COMPACT] = 0;
    state[ST_DID_COMPACT] = 0;
    __threadfence();
  }
}
