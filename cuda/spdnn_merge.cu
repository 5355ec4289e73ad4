// Merging bit-identical rows on the device (exact activation compression).
//
// A row that equals another bit for bit stays equal through every later
// layer, so only one of them needs computing. Steps, all on the device:
//   merge_clear     the scratch below cleared (one launch);
//   row_hashes      a 64-bit hash per held row (candidates only);
//   hash_insert     each hash into an open-addressing table whose entry keeps
//                   the smallest slot with that hash: the row's head;
//   compare_heads   exact comparison of each row with its head, chunk by
//                   chunk of neurons (many warps in flight);
//   mark_reps       a row is merged only when every 32-bit word was equal;
//   plan_reps       prefix of the representatives over tiles, the decision;
//   emit_groups     the (member, owner) positions the host maps back;
//   compact_rows    (spdnn_rows.cu) moves the representatives into dense tiles.
// Every kernel reads the number of held rows from the state and is launched
// for the batch's capacity, so the host enqueues the whole check after the
// layers, with the copy of its result to the host, and waits once.
#include "spdnn_common.cuh"

// Neurons hashed or compared by one warp (chunk hashes are summed): short, so a
// check over a few hundred rows still has thousands of warps, each waiting on
// few loads (256 took 67 and 103 us for the two passes over 192 rows at 4096).
#define MERGE_CHUNK 64
#define MERGE_LOADS 16  // loads a lane issues before it uses them
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

// Words i .. i + MERGE_LOADS - 1 of a row (a neuron every 32 words, through L2),
// all loads issued before any is used; past i1: 0.
__device__ __forceinline__ void load_words(u32 (&v)[MERGE_LOADS], const u32* row, int i,
                                           int i1) {
#pragma unroll
  for (int q = 0; q < MERGE_LOADS; ++q) v[q] = i + q < i1 ? __ldcg(row + (i64)(i + q) * 32) : 0u;
}

__device__ __forceinline__ u64 splitmix64(u64 x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The scratch of a merge over at most cap slots, cleared: hash keys and
// difference bits zero, table entries empty (key 0) with no head (INT_MAX).
// The table has at least twice cap entries, so its loop covers the rest.
extern "C" __global__ void merge_clear(int cap, int table_size, u64* keys, u32* differs,
                                       u64* table_keys, int* table_min) {
  const int n_tiles = (cap + 31) / 32;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < table_size;
       i += blockDim.x * gridDim.x) {
    table_keys[i] = 0ull;
    table_min[i] = 0x7fffffff;
    if (i < cap) keys[i] = 0ull;
    if (i < n_tiles) differs[i] = 0u;
  }
}

// body(t, c, i0, i1, n_rows) once per (tile t, chunk c of neurons [i0, i1)) of the
// held rows, one warp per unit: the loop of row_hashes and compare_heads.
template <typename Body>
__device__ __forceinline__ void for_tile_chunks(const int* state, int width, Body body) {
  const int n_rows = ld_state(state, ST_ROWS);
  const int n_tiles = (n_rows + 31) / 32;
  const int n_chunks = (width + MERGE_CHUNK - 1) / MERGE_CHUNK;
  const i64 nw = (i64)(blockDim.x >> 5) * gridDim.x;
  for (i64 w = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
       w < (i64)n_tiles * n_chunks; w += nw) {
    const int t = (int)(w / n_chunks), c = (int)(w - (i64)t * n_chunks);
    body(t, c, c * MERGE_CHUNK, min(width, (c + 1) * MERGE_CHUNK), n_rows);
  }
}

// keys[s] += mix(FNV-1a of the 32-bit words of slot s over one chunk, chunk).
// One warp per (tile, chunk); keys must be zero on entry.
extern "C" __global__ void __launch_bounds__(256)
    row_hashes(const i64* ptrs, const int* state, int width, u64* keys) {
  const u32* buf = reinterpret_cast<const u32*>(current_features(ptrs, state));
  const i64 tstride = ptrs[P_TSTRIDE];
  const int lane = threadIdx.x & 31;
  for_tile_chunks(state, width, [&](int t, int c, int i0, int i1, int n_rows) {
    const u32* row = buf + t * tstride + lane;
    u64 h = FNV_OFFSET;
    for (int i = i0; i < i1; i += MERGE_LOADS) {
      u32 v[MERGE_LOADS];
      load_words(v, row, i, i1);
#pragma unroll
      for (int q = 0; q < MERGE_LOADS; ++q) {
        if (i + q < i1) h = (h ^ v[q]) * FNV_PRIME;
      }
    }
    const int s = t * 32 + lane;
    const u64 mixed = SPDNN_MERGE_COLLIDE ? 0ull : splitmix64(h ^ (u64)c * 0x9e3779b97f4a7c15ull);
    if (s < n_rows) atomicAdd(keys + s, mixed);
  });
}

// Inserts each held slot's hash into a table of 2^log_size entries (linear
// probing; 0 marks an empty entry, so a hash of 0 is taken as 1: a collision
// only loses a merge). table_min[e] becomes the smallest slot whose hash is
// entry e's, the head of every row with that hash; entry[s] is slot s's entry.
// table_keys must be zero and table_min INT_MAX on entry.
extern "C" __global__ void hash_insert(const int* state, const u64* keys, int log_size,
                                       u64* table_keys, int* table_min, int* entry) {
  const int n_rows = ld_state(state, ST_ROWS);
  const u64 last = (1ull << log_size) - 1ull;
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n_rows; s += blockDim.x * gridDim.x) {
    const u64 key = keys[s] ? keys[s] : 1ull;
    u64 e = (key ^ (key >> 32)) & last;
    for (;;) {  // the table holds at least twice the rows: an empty entry exists
      const u64 was = atomicCAS(table_keys + e, 0ull, key);
      if (was == 0ull || was == key) break;
      e = (e + 1) & last;
    }
    atomicMin(table_min + e, s);
    entry[s] = (int)e;
  }
}

__device__ __forceinline__ int head_of(const int* table_min, const int* entry, int s) {
  return table_min[entry[s]];
}

// One warp per (tile, chunk of neurons): lane s compares its row with its
// head's word by word over the chunk and sets its bit in differs[t] on any
// difference. differs must be zero on entry.
extern "C" __global__ void __launch_bounds__(256)
    compare_heads(const i64* ptrs, const int* state, int width, const int* table_min,
                  const int* entry, u32* differs) {
  const u32* buf = reinterpret_cast<const u32*>(current_features(ptrs, state));
  const i64 tstride = ptrs[P_TSTRIDE];
  const int lane = threadIdx.x & 31;
  for_tile_chunks(state, width, [&](int t, int c, int i0, int i1, int n_rows) {
    const int s = t * 32 + lane;
    const int h = s < n_rows ? head_of(table_min, entry, s) : s;
    if (!__any_sync(0xffffffffu, h != s)) return;
    const u32* mine = buf + t * tstride + lane;
    const u32* theirs = buf + (i64)(h >> 5) * tstride + (h & 31);
    bool differ = false;
    if (h != s) {
      for (int i = i0; i < i1; i += MERGE_LOADS) {
        u32 a[MERGE_LOADS], b[MERGE_LOADS];  // past i1 both 0: no difference
        load_words(a, mine, i, i1);
        load_words(b, theirs, i, i1);
#pragma unroll
        for (int q = 0; q < MERGE_LOADS; ++q) differ |= a[q] != b[q];
      }
    }
    const u32 bits = __ballot_sync(0xffffffffu, differ);
    if (lane == 0 && bits) atomicOr(differs + t, bits);
  });
}

// One thread per slot: representatives (first of a run, or not equal to it)
// get their bit in mask; owner[s] is the slot whose results s takes.
extern "C" __global__ void mark_reps(const int* state, const int* table_min, const int* entry,
                                     const u32* differs, u32* mask, int* owner) {
  const int n_rows = ld_state(state, ST_ROWS);
  const int n_tiles = (n_rows + 31) / 32;
  const int lane = threadIdx.x & 31;
  for (int base = blockIdx.x * blockDim.x; base < n_tiles * 32; base += blockDim.x * gridDim.x) {
    const int s = base + threadIdx.x;
    const bool real = s < n_rows;
    const int h = real ? head_of(table_min, entry, s) : s;
    const bool merged = real && h != s && !((differs[s >> 5] >> lane) & 1u);
    const u32 reps = __ballot_sync(0xffffffffu, real && !merged);
    if (lane == 0 && s < n_tiles * 32) mask[s >> 5] = reps;
    if (real) owner[s] = merged ? h : s;
  }
}

// One block: representatives' prefix over tiles (tile_base), and the plan
// compact_rows follows (it moves them out of the current buffer); the header
// of the host's copy: out = [held rows, representatives, ...].
extern "C" __global__ void plan_reps(const i64* ptrs, int* state, u64* stamps, int k, int* out) {
  const int n_rows = ld_state(state, ST_ROWS);
  const int n_tiles = (n_rows + 31) / 32;
  const u32* mask = layer_mask(ptrs, k);
  int* tile_base = reinterpret_cast<int*>(ptrs[P_TILE_BASE]);
  const int reps = tile_prefix<1>(mask, nullptr, tile_base, n_tiles, n_rows);
  if (threadIdx.x == 0) {
    state[ST_MERGE_ROWS] = n_rows;
    state[ST_NEW_ROWS] = reps;
    out[0] = n_rows;
    out[1] = reps;
    const int merge = reps < n_rows;
    state[ST_DO_COMPACT] = merge ? COMPACT_EXACT : COMPACT_NONE;  // compact_rows follows
    stamps[k + 1] = global_ns();
  }
}

// Positions for the host, before compaction moves them, in one array (one
// copy to the host): out = [n, reps, kept[reps], members[n - reps], owners[n - reps]].
extern "C" __global__ void __launch_bounds__(256)
    emit_groups(const i64* ptrs, const int* state, int k, const int* owner, int* out) {
  const int* pos = current_positions(ptrs, state);
  const u32* mask = layer_mask(ptrs, k);
  const int* tile_base = reinterpret_cast<const int*>(ptrs[P_TILE_BASE]);
  const int n_rows = ld_state(state, ST_MERGE_ROWS);
  const int reps = ld_state(state, ST_NEW_ROWS);
  int* kept = out + 2;
  int* members = kept + reps;
  int* owners = members + (n_rows - reps);
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n_rows; s += blockDim.x * gridDim.x) {
    const int t = s >> 5, lane = s & 31;
    const u32 m = mask[t];
    const int rep_rank = tile_base[t] + __popc(m & ((1u << lane) - 1u));
    if ((m >> lane) & 1u) {
      kept[rep_rank] = pos[s];
    } else {
      const int r = s - rep_rank;
      members[r] = pos[s];
      owners[r] = pos[owner[s]];
    }
  }
}
