// Device helpers of a step over several sequences in the paged KV cache (PagedRows, launchers.h):
// which sequence a row belongs to, its absolute position, and the cache position (block slot) of a
// sequence position. A layer's paged cache is [n_kv][n_blocks * block_size][hd], so the kernels of
// the contiguous cache address it unchanged once a position is translated to its slot.
#pragma once
#include <cstdint>

#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

struct PagedRow {
  int seq, pos, n_rows;  // its sequence, absolute position, and that sequence's rows in the step
};

// The sequence of step row `row`: the last i with row_start[i] <= row (a sequence with no rows
// shares its start with the next one, which is the one holding the row).
__device__ __forceinline__ PagedRow paged_row(const PagedRows& p, int row) {
  int lo = 0, hi = p.n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.row_start[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  const int r0 = p.row_start[lo];
  return PagedRow{lo, p.pos0[lo] + (row - r0), p.row_start[lo + 1] - r0};
}

// Cache position of position `pos` of sequence `seq`.
__device__ __forceinline__ int64_t paged_slot(const PagedRows& p, int seq, int pos) {
  const int b = p.tables[int64_t(seq) * p.max_blocks + pos / p.block_size];
  return int64_t(b) * p.block_size + pos % p.block_size;
}

}  // namespace nf4flash::cuda
