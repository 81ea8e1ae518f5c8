// Host side of the mixture-of-experts kernels (kernels/moe.cuh): their arguments, the scratch
// layout of one MoE block's step, and the launchers (ops_moe.cu).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

constexpr int kMoeMaxExperts = 512, kMoeMaxTopK = 16;
// A decode step of at most this many experts routes inside the gate/up launch (moe_route_folds).
constexpr int kMoeFoldMaxExperts = 128;
// The routed pairs of one expert are cut into chunks of at most kMoeChunk (one unit of the GEMV).
constexpr int kMoeChunk = 8;

// One expert's matrix: 4-bit tiles (tile16x64) with their absmax ([RT][KT][16], f32, or u8 codes
// with the nested absmax and offset for double quant), or dense rows in the compute dtype.
struct MoeExpertW {
  const void* w = nullptr;
  const void* absmax = nullptr;
  const float* nested_absmax = nullptr;
  float offset = 0.f;
};
// gate, up or down of every expert: the device table [E] and what all of them share.
struct MoeMatArgs {
  const MoeExpertW* experts = nullptr;
  int64_t rows = 0, cols = 0, RT = 0, KT = 0;  // KT: 64-column tiles, ceil(cols / 64)
  float code[16] = {};
  const float* nested_code = nullptr;
  int log2_blocksize = 6, log2_nested = 8;
};
struct MoeRouteArgs {
  const float* logits = nullptr;  // [T, E] f32
  int T = 0, E = 0, K = 0, norm = 0;
  int32_t* ids = nullptr;         // [T*K] experts of each row, ascending
  float* wts = nullptr;           // [T*K] their weights
  int32_t* pos_of = nullptr;      // [T*K] pair -> position grouped by expert
  int32_t* row_of = nullptr;      // [T*K] position -> row t
  int32_t* chunks = nullptr;      // [max_chunks][3] (expert, first position, pairs <= 8)
  int32_t* n_chunks = nullptr;    // [1]
};
struct MoeGemvArgs {
  MoeMatArgs m[2];                    // SwiGLU: gate, up; Store: m[0]
  const void* x = nullptr;            // rows of m[0].cols values, compute dtype
  const int32_t* row_of = nullptr;    // x row of position q (SwiGLU); null: row q (Store)
  const int32_t* chunks = nullptr;
  const int32_t* n_chunks = nullptr;
  void* out = nullptr;                // [T*K, m[0].rows] by position
  int wpu = 8;                        // warps a unit (set by moe_gemv)
  int one_row_chunks = 0;             // the one-row form: chunks (= K, set by moe_gemv)
  // The one-row form with logits: each block routes the row itself as moe_route does (E <=
  // kMoeFoldMaxExperts, norm as MoeRouteArgs::norm), block 0 stores ids and wts; chunks unused.
  const float* logits = nullptr;      // [1, E] f32
  int E = 0, norm = 0;
  int32_t* ids = nullptr;             // [K]
  float* wts = nullptr;               // [K]
};
struct MoeCombineArgs {
  const void* y = nullptr;              // [T*K, cols] by position
  const float* wts = nullptr;
  const int32_t* pos_of = nullptr;
  const void* shared = nullptr;         // [T, cols] or null
  const float* shared_logit = nullptr;  // [T]
  void* out = nullptr;                  // [T, cols]
  int64_t cols = 0;
  int T = 0, K = 0;
  int residual = 0;                     // out += the sum (rounded first, as add() adds)
};

// Chunks of <= 8 pairs of one expert that T*K pairs over E experts can need at most.
inline int64_t moe_max_chunks(int64_t T, int K, int E) {
  const int64_t P = T * K;
  return std::min(P, P / 8 + std::min<int64_t>(E, P));
}
// Byte offsets of one step's arrays in the scratch (each 256-byte aligned): routing arrays, the
// experts' SwiGLU outputs h [T*K, inter] and down outputs y [T*K, hidden], compute dtype es bytes.
struct MoeScratch {
  size_t ids, wts, pos_of, row_of, chunks, n_chunks, h, y, bytes;
};
inline MoeScratch moe_scratch(int64_t T, int K, int E, int64_t inter, int64_t hidden, size_t es) {
  const size_t P = size_t(T) * size_t(K);
  MoeScratch s{};
  size_t at = 0;
  auto take = [&](size_t n) {
    const size_t o = at;
    at += (n + 255) / 256 * 256;
    return o;
  };
  s.ids = take(P * 4);
  s.wts = take(P * 4);
  s.pos_of = take(P * 4);
  s.row_of = take(P * 4);
  s.chunks = take(size_t(moe_max_chunks(T, K, E)) * 12);
  s.n_chunks = take(4);
  s.h = take(P * size_t(inter) * es);
  s.y = take(P * size_t(hidden) * es);
  s.bytes = at;
  return s;
}

enum class MoeKind : int { Q4 = 0, Q4DoubleQuant = 1, Dense = 2 };
void moe_route(const MoeRouteArgs& a, cudaStream_t st);
// Grid from max_chunks (the bound on *n_chunks) so that a captured launch serves every routing;
// max_pairs: the most pairs a chunk can hold (1 for one row: a decode step; else 8).
void moe_gemv(const MoeGemvArgs& a, MoeKind kind, bool swiglu, int64_t max_chunks, int max_pairs, DType act,
              cudaStream_t st);
void moe_combine(const MoeCombineArgs& a, DType act, cudaStream_t st);
// One row (a decode step): the K chosen experts' down products of h [K, I] (position k = the k-th
// chosen expert, ids[k]) and their weighted sum as moe_combine takes it (sum: wts, the shared
// expert, out and K; its y, pos_of and cols unused), into out [1, H].
struct MoeDownCombineArgs {
  MoeMatArgs m;                  // down of every expert: 4-bit, [H, I]
  const void* x = nullptr;       // h [K, I], compute dtype
  const int32_t* ids = nullptr;  // [K] ascending
  MoeCombineArgs sum;
};
constexpr int kMoeDcWarps = 16;  // moe_down_combine_kernel's warps: at most one expert each
// Whether moe_down_combine serves K experts a row stored as `kind` at compute dtype `act` (4-bit at
// bf16/f16, K <= kMoeDcWarps).
inline bool moe_down_combine_applies(MoeKind kind, DType act, int K) {
  return kind != MoeKind::Dense && act != DType::F32 && K >= 1 && K <= kMoeDcWarps;
}
void moe_down_combine(const MoeDownCombineArgs& a, MoeKind kind, DType act, cudaStream_t st);
// The one-row form of moe_gemv (a decode step's gate and up): 4-bit experts at bf16/f16 with x
// rows of at most kMoeOneRowMaxCols values (staged in shared memory beside the code table).
constexpr int64_t kMoeOneRowMaxCols = 16384;
inline bool moe_one_row_applies(MoeKind gate_up, DType act, int64_t cols) {
  return gate_up != MoeKind::Dense && act != DType::F32 && cols <= kMoeOneRowMaxCols;
}
// Whether a step of T rows routes inside the one-row gate/up launch (MoeGemvArgs::logits) rather
// than in moe_route: one row through the one-row form, down products through moe_down_combine
// (which reads only ids and wts), E <= kMoeFoldMaxExperts.
inline bool moe_route_folds(int64_t T, MoeKind gate_up, MoeKind down, DType act, int64_t hidden, int K, int E) {
  return T == 1 && moe_one_row_applies(gate_up, act, hidden) && moe_down_combine_applies(down, act, K) &&
         E <= kMoeFoldMaxExperts;
}

}  // namespace nf4flash::cuda
