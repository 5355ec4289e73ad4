// What the layers-in-one-launch kernels share (spdnn_held.cu: converged rows
// held in one tile; spdnn_runs.cu: layers over every tile held): the per-layer
// argument table, the grid's barrier, the group ids in registers and one
// group's sums and epilogue, the adds of layer_group_sum in its order.
#pragma once
#include "spdnn_layer.cuh"

// One layer's arguments, in a device array indexed by layer (the host builds
// it with the same field offsets: held.HELD_LAYER_DTYPE).
struct HeldLayer {
  const u16* gidx;  // n_groups x D input ids
  const int* gout;  // n_groups x 16 output ids (-1: unused slot)
  const float* bias_v;  // null: bias_s for every output
  int n_groups;  // a multiple of 4
  int n_in;
  int n_out;
  float scale;
  float bias_s;
  float floor;
  float clip;
  // the input ids as groups of the layer before (held_group_inputs), where that
  // layer has one bias and runs in the same form: a run's layer before it then
  // stores one value a group, which this layer reads; null: ids of neurons
  const u16* gidx_grp;
};

// The ids a layer of a run reads: groups of the layer before where it stored one
// value a group (not the run's first layer, which reads the rows as they came).
__device__ __forceinline__ const u16* run_inputs(const HeldLayer& L, bool first) {
  return !first && L.gidx_grp ? L.gidx_grp : L.gidx;
}

// Whether a layer of a run stores one value a group: the next layer of the run
// reads them so (and this layer has one bias: the host sets gidx_grp only then).
__device__ __forceinline__ bool stores_groups(const HeldLayer& L, const HeldLayer& next,
                                              bool last) {
  return !last && next.gidx_grp && !L.bias_v;
}

// The grid's barrier, every block resident (a cooperative launch), in two
// halves: no block passes wait() before every block reached arrive(), and the
// writes before arrive() are seen after wait() (release / acquire); both are
// called by every thread of a block. A counter in global memory (the state's
// ST_DONE, zero between kernels) that each block adds one to a barrier; the
// n-th barrier is passed at n x blocks. The last block out sets it back to zero
// (done()).
struct GridBarrier {
  u32* counter;
  u32 passed;  // the count that passes the next barrier
  __device__ __forceinline__ void arrive() {
    __syncthreads();  // the block's writes before thread 0's release
    passed += gridDim.x;
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    }
  }
  __device__ __forceinline__ void wait() {
    if (threadIdx.x == 0) {
      u32 seen;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
      } while (seen < passed);
    }
    __syncthreads();
  }
  __device__ __forceinline__ void done() {
    if (threadIdx.x == 0 && atomicAdd(counter, 1u) == passed + gridDim.x - 1) *counter = 0u;
  }
};

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// bytes from p on into L2, 128 bytes a thread of the launch.
__device__ __forceinline__ void prefetch_bytes(const void* p, i64 bytes, int thread,
                                               int n_threads) {
  const char* at = reinterpret_cast<const char*>(p);
  for (i64 off = (i64)thread * 128; off < bytes; off += (i64)n_threads * 128) {
    prefetch_l2(at + off);
  }
}

// A layer's group ids, input (``in``: its gidx or gidx_grp) and output, into L2.
template <int D>
__device__ __forceinline__ void prefetch_ids(const HeldLayer& L, const u16* in, int thread,
                                             int n_threads) {
  prefetch_bytes(in, (i64)L.n_groups * D * 2, thread, n_threads);
  prefetch_bytes(L.gout, (i64)L.n_groups * 64, thread, n_threads);
}

// A group's input ids (D / 8 uint4) and output ids (4 int4) in registers.
template <int D>
struct GroupIds {
  uint4 in[D / 8];
  int4 out[4];
};

template <int D>
__device__ __forceinline__ void load_group_ids(const HeldLayer& L, const u16* in, int g,
                                               GroupIds<D>& ids) {
  const uint4* ip = reinterpret_cast<const uint4*>(in) + (i64)g * (D / 8);
  const int4* op = reinterpret_cast<const int4*>(L.gout) + (i64)g * 4;
#pragma unroll
  for (int q = 0; q < D / 8; ++q) ids.in[q] = __ldg(ip + q);
#pragma unroll
  for (int q = 0; q < 4; ++q) ids.out[q] = __ldg(op + q);
}

// f(id) for each used output slot of a group (16 slots, -1: unused); returns
// whether there was one (the host pads the group count with empty groups).
template <int D, class F>
__device__ __forceinline__ bool each_output(const GroupIds<D>& ids, F f) {
  bool used = false;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int out[4] = {ids.out[q].x, ids.out[q].y, ids.out[q].z, ids.out[q].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int id = out[e];
      if (id >= 0) {
        f(id);
        used = true;
      }
    }
  }
  return used;
}

// One group g on this lane's 4 rows (xq: the rows' neuron 0 of the input tile): the
// sum of layer_group_sum, then each used slot's epilogue stored at dst (once for
// all slots where the layer has one bias: the values are the same), or with
// ``grouped`` once at group g's place; returns the rows' alive bits as bits of the
// tile. ``gather``: false where none of the lane's rows is held; their values are
// never read, and zero sums stand in for them without reading their inputs.
template <int D>
__device__ __forceinline__ u32 held_group(const HeldLayer& L, const GroupIds<D>& ids,
                                          const float* xq, float* dst, int r4, int g,
                                          bool grouped, bool gather = true) {
  constexpr int B = D < SPDNN_HELD_BATCH ? D : SPDNN_HELD_BATCH;
  // the order and rounding of layer_group_sum; written by other blocks: through L2
  const float4 acc = gather ? sum_rows4<D, B>(ids.in, xq, [](const float* p) {
    return __ldcg(reinterpret_cast<const float4*>(p));
  }) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (!L.bias_v) {  // one bias: every slot of the group holds the same values
    const float4 y = activate4(acc, L.scale, L.bias_s, L.floor, L.clip);
    bool used;
    if (grouped) {
      *reinterpret_cast<float4*>(dst + (i64)g * 32 + r4) = y;
      used = each_output<D>(ids, [](int) {});
    } else {
      used = each_output<D>(ids, [&](int id) {
        *reinterpret_cast<float4*>(dst + (i64)id * 32 + r4) = y;
      });
    }
    return used ? alive4(y) << r4 : 0u;
  }
  u32 alive = 0u;
  each_output<D>(ids, [&](int id) {
    const float4 y = activate4(acc, L.scale, __ldg(L.bias_v + id), L.floor, L.clip);
    *reinterpret_cast<float4*>(dst + (i64)id * 32 + r4) = y;
    alive |= alive4(y) << r4;
  });
  return alive;
}
