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
                       drop_dead}

__device__ __forceinline__ float bias_of(int j, const LayerArgs& a) {
  return a.bias_v ? __ldg(a.bias_v + j) : a.bias_s;
}

// scale * acc + bias, then the activation (ReLU: floor 0; none: floor -inf) and the clip.
__device__ __forceinline__ float activate(float acc, float b, const LayerArgs& a) {
  return fminf(fmaxf(fmaf(acc, a.scale, b), a.floor), a.clip);
}

__device__ __forceinline__ float epilogue(float acc, int j, const LayerArgs& a) {
  return activate(acc, bias_of(j, a), a);
}

__device__ __forceinline__ void finish_layer(const LayerArgs& a) {
  if (last_block_done(a.state)) {
    u32* mask = a.masks + (a.k & 1) * a.max_tiles;
    u32* next = a.masks + ((a.k + 1) & 1) * a.max_tiles;
    block_plan(a.state, mask, next, a.tile_base, a.live_hist, a.stamps, a.k, a.drop_dead);
  }
}

// Epilogue of 4 rows of output j, one 16-byte store; returns their alive bits.
__device__ __forceinline__ u32 store_rows4(float4 acc, int j, const LayerArgs& a, float* out) {
  const float b = bias_of(j, a);
  const float4 y = make_float4(activate(acc.x, b, a), activate(acc.y, b, a),
                               activate(acc.z, b, a), activate(acc.w, b, a));
  *reinterpret_cast<float4*>(out + (i64)j * 32) = y;
  return (u32)(y.x != 0.0f) | (u32)(y.y != 0.0f) << 1 | (u32)(y.z != 0.0f) << 2 |
         (u32)(y.w != 0.0f) << 3;
}
