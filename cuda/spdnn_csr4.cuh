// The CSR4 layout's sums (layer_csr4 in spdnn_layers.cu, whole_network in
// spdnn_whole.cu): 16-bit input ids, 8 to a 16-byte load, and a lane's 4 rows
// as one float4.
#pragma once
#include "spdnn_layer.cuh"

// 4 consecutive rows of one neuron: a shared or a read-only global load.
template <bool SMEM>
__device__ __forceinline__ float4 load_rows4(const float* p) {
  if constexpr (SMEM) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    return __ldg(reinterpret_cast<const float4*>(p));
  }
}

// CSR4: any degree per output, optionally per-nonzero values, 16-bit indices,
// with the ELL kernels' float4 rows (8 lanes per output, 4 outputs per warp
// step). Each output's indices (and values) start at a multiple of 8, so 8 of
// them come in one 16-byte load (two for values); entries past the degree
// are loaded (index 0) but not added. Sums in CSR order, one fmaf per value
// as in layer_csr, so both give the same bits.
struct Csr4Chunk {
  uint4 idx;
  float4 v0, v1;
};

template <bool VALS>
__device__ __forceinline__ Csr4Chunk csr4_chunk(const uint4* __restrict__ ip,
                                                const float4* __restrict__ vp, int c) {
  Csr4Chunk k;
  k.idx = __ldg(ip + c);
  if constexpr (VALS) {
    k.v0 = __ldg(vp + 2 * c);
    k.v1 = __ldg(vp + 2 * c + 1);
  } else {
    k.v0 = k.v1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // not read: uniform weights
  }
  return k;
}

// The 8 gathers of a chunk (entries past the degree read input 0, not added);
// neuron i of the rows at xq is at xq + STRIDE i (32: a feature tile).
template <bool SMEM, int STRIDE = 32>
__device__ __forceinline__ void csr4_gather(float4 (&x)[8], const Csr4Chunk& k,
                                            const float* xq) {
  const u32 w[4] = {k.idx.x, k.idx.y, k.idx.z, k.idx.w};
#pragma unroll
  for (int p = 0; p < 8; ++p) {
    const u32 i = (p & 1) ? (w[p / 2] >> 16) : (w[p / 2] & 0xffffu);
    x[p] = load_rows4<SMEM>(xq + i * STRIDE);
  }
}

// The chunk's terms added in order (the first ``left`` entries are real).
template <bool VALS>
__device__ __forceinline__ void csr4_fma(float4& acc, const Csr4Chunk& k, int left,
                                         const float4 (&x)[8]) {
  const float v[8] = {k.v0.x, k.v0.y, k.v0.z, k.v0.w, k.v1.x, k.v1.y, k.v1.z, k.v1.w};
#pragma unroll
  for (int p = 0; p < 8; ++p) {
    if (p < left) {
      if constexpr (VALS) {
        acc.x = fmaf(v[p], x[p].x, acc.x);
        acc.y = fmaf(v[p], x[p].y, acc.y);
        acc.z = fmaf(v[p], x[p].z, acc.z);
        acc.w = fmaf(v[p], x[p].w, acc.w);
      } else {
        add_rows4(acc, x[p]);
      }
    }
  }
}

// The first N of an output's n chunks into the ring.
template <bool VALS, int N>
__device__ __forceinline__ void csr4_first_chunks(Csr4Chunk (&ring)[N],
                                                  const uint4* __restrict__ ip,
                                                  const float4* __restrict__ vp, int n) {
#pragma unroll
  for (int q = 0; q < N; ++q) {
    if (q < n) ring[q] = csr4_chunk<VALS>(ip, vp, q);
  }
}

// Staged (gathers are shared loads): the next chunk's indices and values are
// loaded while the current one is gathered and added.
template <bool VALS, int STRIDE = 32>
__device__ __forceinline__ float4 csr_rows4_staged(const uint4* __restrict__ ip,
                                                   const float4* __restrict__ vp, int deg,
                                                   const float* xq) {
  const int n = (deg + 7) / 8;  // chunks
  Csr4Chunk ring[1];
  csr4_first_chunks<VALS>(ring, ip, vp, n);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int c = 0; c < n; ++c) {
    const Csr4Chunk k = ring[0];
    if (c + 1 < n) ring[0] = csr4_chunk<VALS>(ip, vp, c + 1);
    float4 x[8];
    csr4_gather<true, STRIDE>(x, k, xq);
    csr4_fma<VALS>(acc, k, deg - 8 * c, x);
  }
  return acc;
}
