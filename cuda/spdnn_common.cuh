// Shared definitions of the spdnn CUDA kernels: device-resident state and the
// per-layer plan (live count, prefix over tiles, compaction decision).
//
// Features live in tiles of 32 rows stored neuron-major: element (row r of
// tile t, neuron i) is at t * tstride + i * 32 + r, so one warp (lane = row)
// reads 128 contiguous bytes per input neuron.  Everything the layer loop
// needs to decide (rows alive, tiles in use, which buffer is current) lives in
// a small int array on the device, so the host never waits inside the loop.
//
// Every SPDNN_* parameter comes from the #define block of KernelConfig
// (spdnn_mpi/backends/cuda/config.py), put before these files: the NVRTC
// program of the backend and tools/compile_kernels.sh both do.
#pragma once

#ifndef SPDNN_SMEM_THREADS
#error "SPDNN_* settings missing: compile after KernelConfig().define_block() (spdnn_mpi/backends/cuda/config.py)"
#endif

// Slots of the int state array.
#define ST_ROWS 0         // active row slots
#define ST_TILES 1        // tiles in use = ceil(rows / 32)
#define ST_SEL 2          // features are in buffer SEL (0 or 1)
#define ST_POS_SEL 3      // row positions are in pos array POS_SEL
#define ST_DO_COMPACT 4   // set by the plan (COMPACT_*), done by the next layer or compact_rows
#define ST_NEW_ROWS 5     // rows alive after the last layer
#define ST_DONE 6         // finished-block counter (last-block pattern)
#define ST_DID_COMPACT 7  // the last layer was followed by a compaction
#define ST_COMPACTIONS 8  // compactions so far (reported)
#define ST_MERGE_ROWS 9   // rows held before the last merge of identical rows
#define ST_NEW_SLOTS 10   // rows after the pending compaction on write
#define ST_HAS_PAD 11     // the buffer holds padding slots (dead rows) of a padded compaction
#define ST_PADDED_COMPACTIONS 12  // of ST_COMPACTIONS, those to 8-aligned slots (reported)
#define ST_LAYERS 13      // layers of the network (the plan weighs a compaction by those left)
#define ST_INPUT_BITS 14  // the batch's inputs are bits (scatter_bits), read so by layer 0
#define ST_SIZE 16

// Values of ST_DO_COMPACT. One word says both whether and how, and the
// 8-aligned slots are the second half of tile_base, so a layer kernel loads
// nothing more than before (a second state word and a pointer-table entry
// loaded at each kernel's start cost 0.7 us a layer at N = 1024: 14.7 against
// 14.0 us, H100, 2026-12-06).
#define COMPACT_NONE 0
#define COMPACT_EXACT 1   // survivors to tile_base[t] + rank: dense slots
#define COMPACT_PADDED 2  // to tile_slot[t] + rank: each tile's survivors PAD_SLOTS-aligned

// A padded compaction starts each input tile's survivors at a multiple of
// PAD_SLOTS slots (8 floats: one 32-byte sector) and writes the slots after
// them up to the next multiple as dead rows (spdnn_layer.cuh).
#define PAD_SLOTS 8

// ``n`` slots rounded up to the next multiple of PAD_SLOTS.
__device__ __forceinline__ int padded_slots(int n) {
  return (n + PAD_SLOTS - 1) & ~(PAD_SLOTS - 1);
}

// Slots of the pointer table (an i64 array on the device). Kernels take the
// buffers from it rather than as arguments, so a captured CUDA graph of the
// layer loop stays valid when the buffers are reallocated for a new batch.
#define P_BUF0 0
#define P_BUF1 1
#define P_POS0 2
#define P_POS1 3
#define P_MASKS 4
#define P_TILE_BASE 5  // 2 x max_tiles: each tile's first slot, exact, then 8-aligned (tile_slot)
#define P_TSTRIDE 6
#define P_MAX_TILES 7
#define P_SIZE 8

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

__device__ __forceinline__ int ld_state(const int* state, int slot) {
  return __ldcg(state + slot);
}

// The current feature buffer, the current row positions and layer k's alive
// bits (parity k & 1), from the pointer table and the state.
__device__ __forceinline__ const float* current_features(const i64* ptrs, const int* state) {
  return reinterpret_cast<const float*>(ptrs[ld_state(state, ST_SEL) ? P_BUF1 : P_BUF0]);
}

__device__ __forceinline__ const int* current_positions(const i64* ptrs, const int* state) {
  return reinterpret_cast<const int*>(ptrs[ld_state(state, ST_POS_SEL) ? P_POS1 : P_POS0]);
}

__device__ __forceinline__ const u32* layer_mask(const i64* ptrs, int k) {
  return reinterpret_cast<const u32*>(ptrs[P_MASKS]) + (k & 1) * ptrs[P_MAX_TILES];
}

// Bits of the rows of tile t that hold a real row (the last tile may be partial).
__device__ __forceinline__ u32 valid_bits(int t, int n_rows) {
  const int left = n_rows - t * 32;
  if (left >= 32) return 0xffffffffu;
  if (left <= 0) return 0u;
  return (1u << left) - 1u;
}

// 16-byte asynchronous copy global -> shared (sm_80+), completed by cp_async_wait_all.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  unsigned s;
  asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
               : "=r"(s)
               : "l"(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

__device__ __forceinline__ u64 global_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The state block_plan would leave after a run's last layer: its outputs in buffer
// sel, live rows alive, no compaction pending (one thread, at the end of a launch
// of several layers: the held forms, whole_network).
__device__ __forceinline__ void held_run_end(int* state, int sel, int live) {
  state[ST_SEL] = sel;
  state[ST_NEW_ROWS] = live;
  state[ST_DO_COMPACT] = 0;
  state[ST_DID_COMPACT] = 0;
  __threadfence();
}

// Every block calls this at its end; returns true in exactly one block, the
// last to finish, after all other blocks' writes are visible.
__device__ __forceinline__ bool last_block_done(int* state) {
  __shared__ bool s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const u32 prev = atomicAdd(reinterpret_cast<u32*>(state + ST_DONE), 1u);
    s_last = (prev == gridDim.x - 1);
  }
  __syncthreads();
  if (s_last) __threadfence();
  return s_last;
}

// Run by all threads of one block: inclusive scan of v over the block's threads
// in thread order, a sum or (MAX) a maximum; sh holds 32 ints of shared memory,
// free again on return. total (if given) gets the whole block's result.
template <bool MAX = false>
__device__ __forceinline__ int block_scan(int v, int* sh, int* total = nullptr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int none = MAX ? -0x7fffffff - 1 : 0;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v = MAX ? max(v, t) : v + t;
  }
  if (lane == 31) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = lane < nwarps ? sh[lane] : none;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w = MAX ? max(w, t) : w + t;
    }
    sh[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v = MAX ? max(v, sh[warp - 1]) : v + sh[warp - 1];
  if (total) *total = sh[nwarps - 1];
  __syncthreads();  // sh is reused by the next scan
  return v;
}

// Run by all threads of one block: exclusive prefix over tiles of the rows
// set in mask (& valid) into tile_base, each tile's count first rounded up to
// a multiple of ALIGN (1, or 8 for a padded compaction: tile_slot);
// returns the total to every thread. Clears next_mask (the other parity, for
// the next layer) unless it is null.
template <int ALIGN>
__device__ int tile_prefix(const u32* mask, u32* next_mask, int* tile_base, int n_tiles,
                           int n_rows) {
  __shared__ int s_scan[32];
  int carry = 0;
  for (int base = 0; base < n_tiles; base += blockDim.x) {
    const int t = base + threadIdx.x;
    int c = 0;
    if (t < n_tiles) {
      c = __popc(__ldcg(mask + t) & valid_bits(t, n_rows));
      c = (c + ALIGN - 1) / ALIGN * ALIGN;
      if (next_mask) next_mask[t] = 0u;
    }
    int total;
    const int pre = block_scan(c, s_scan, &total) - c;
    if (t < n_tiles) tile_base[t] = carry + pre;
    carry += total;
  }
  return carry;
}

// Narrowest rows whose compactions are padded to 8-aligned slots: at 4096, with
// the settled-rows rule of block_plan, layers 1-10 ran at 57-58 against 48-49 %
// of the floor (4096 x 120 direct 1.09-1.10x, compressed 1.09-1.19x, 4096 x 1920
// direct 1.01x; H100, 2026-12-07); padding at 2048 and less is not measured.
#define PAD_MIN_WIDTH 4096

// Run by all threads of the last block of a layer kernel: count live rows
// (mask & valid), exclusive prefix of live rows over tiles into tile_base
// (and, for a padded compaction, of their 8-aligned slots into tile_slot,
// the second half of tile_base), clear the other parity's masks for the next
// layer, record the count and decide whether the survivors move to dense
// tiles (ST_DO_COMPACT: the next layer writes them there, or compact_rows
// moves them). ``took``: this layer wrote the compaction the previous plan
// asked for, so its rows are the new ones (``padded_now``: in padded slots).
// PADS: the kernel has a padded walk (only those plan padded compactions).
// ``release``: set the finished-block counter back to zero (false where a grid
// barrier on it does that: layers_run_grid).
template <bool PADS>
__device__ void block_plan(int* state, const u32* mask, u32* next_mask, int* tile_base,
                           int max_tiles, int* live_hist, u64* stamps, int k, int drop_dead,
                           bool took, bool padded_now, int width, bool release = true) {
  const int n_rows = ld_state(state, took ? (padded_now ? ST_NEW_SLOTS : ST_NEW_ROWS) : ST_ROWS);
  // read by every thread before the syncs of tile_prefix, written by thread 0 after
  const int has_pad = took ? padded_now : ld_state(state, ST_HAS_PAD);
  const int n_tiles = (n_rows + 31) / 32;
  const int live = tile_prefix<1>(mask, next_mask, tile_base, n_tiles, n_rows);
  // Compact where that frees 1/COMPACT_DIV of the tiles, or any tile while the
  // buffer holds padding. Where padding is used (rows at least PAD_MIN_WIDTH
  // wide): 8-aligned (tile_slot) where the padded slots free as much (rows dying
  // fast); exact only once the rows have all but stopped dying (fewer than a
  // tile's worth this layer) and the tiles freed, times the layers left, are at
  // least the tiles held: an exact compaction of rows still dying splits the
  // next layer's 32-byte sectors for a layout that lasts a layer or two, and
  // settled rows keep it to the end (and drop any padding). Narrower rows, and
  // kernels without a padded walk, compact exactly. The block decides as one.
  const int freed = n_tiles - (live + 31) / 32;
  int compact = 0, settled = 0;
  if (drop_dead && freed > 0) {
    compact = freed * SPDNN_COMPACT_DIV >= n_tiles || has_pad;
    if (width >= PAD_MIN_WIDTH) {  // also where padding is held: it must end once
      const int left = ld_state(state, ST_LAYERS) - k - 1;
      const int before = k > 0 ? __ldcg(live_hist + k - 1) : n_rows;
      settled = before - live < 32 && (i64)freed * left >= n_tiles;
      compact |= settled;
    }
  }
  int slots = live;
  if (PADS && compact && width >= PAD_MIN_WIDTH) {
    slots = tile_prefix<PAD_SLOTS>(mask, nullptr, tile_base + max_tiles, n_tiles, n_rows);
    if ((n_tiles - (slots + 31) / 32) * SPDNN_COMPACT_DIV < n_tiles) {
      slots = live;
      compact = settled;  // no exact compaction of rows still dying at these widths
    }
  }
  const int padded = slots != live;
  if (threadIdx.x == 0) {
    if (took) {
      state[ST_ROWS] = n_rows;
      state[ST_TILES] = n_tiles;
      state[ST_POS_SEL] ^= 1;
      state[ST_COMPACTIONS] += 1;
      state[ST_PADDED_COMPACTIONS] += padded_now;
    }
    live_hist[k] = live;
    state[ST_DO_COMPACT] = compact ? (padded ? COMPACT_PADDED : COMPACT_EXACT) : COMPACT_NONE;
    state[ST_NEW_ROWS] = live;
    state[ST_NEW_SLOTS] = slots;
    state[ST_HAS_PAD] = has_pad;
    state[ST_DID_COMPACT] = 0;
    state[ST_SEL] ^= 1;  // the output is current
    stamps[k + 1] = global_ns();
    __threadfence();
    if (release) state[ST_DONE] = 0;
  }
}
