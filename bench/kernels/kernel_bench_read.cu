// kernel-bench rows "read units": does the order in which one kernel's blocks read a buffer change
// what HBM delivers? The decode kernels read in very different orders: the 4-bit GEMV's blocks take
// 16-row items round robin (a 14336x4096 weight: 264 blocks on 32 KB items, neighbours; the down
// projection 4096x14336: one 112 KB item per block, 264 streams 112 KB apart), decode attention's
// splits each walk one slice of a kv head's cache (66 x 8 blocks, two streams each, ~127 KB apart
// at ctx 32768), the read-only reference reads grid-stride (one window moving through the buffer).
// Same instructions, same bytes in flight, only the order differs between these rows. The unit
// sizes between one chunk and one slice show the length scale if the order matters (e.g. a DRAM
// row whose pieces a stream reaches several steps apart is opened once per piece).
#include <algorithm>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernel_bench_util.h"

namespace nf4flash::kbench {
namespace {

constexpr int kChunkWords = 1024;  // 16-byte words per chunk: 16 KB = 256 threads x 4

// Reads src as nch chunks of 16 KB in units of uc chunks: block b of G takes the units b, b + G,
// b + 2G, ... (unit u = chunks [u*uc, min((u+1)*uc, nch))), each unit's chunks in order. Per chunk
// each of the 256 threads loads 4 words (word i*256 + tid: each load instruction covers 4 KB
// contiguously), and a chunk's loads are issued before the previous chunk's words are summed (two
// chunks, 32 KB, in flight per block). uc = 1: all blocks in one window that moves through the
// buffer; uc = ceil(nch / G): G contiguous slices read side by side. The xor of all words is
// stored only if it equals a value it cannot take (nothing is optimized out).
// Shapes: src [nch * 1024] uint4; grid G x 256 threads.
__global__ void __launch_bounds__(256) read_units_kernel(const uint4* __restrict__ src, uint32_t nch, uint32_t uc,
                                                         uint4* sink) {
  const uint32_t G = gridDim.x, b = blockIdx.x, tid = threadIdx.x;
  const uint32_t nunits = (nch + uc - 1) / uc;
  auto chunk_of = [&](uint32_t k) -> int64_t {  // this block's k-th chunk, -1 past its last
    const uint32_t u = b + (k / uc) * G;
    if (u >= nunits) return -1;
    const uint32_t c = u * uc + k % uc;
    return c < nch ? int64_t(c) : -1;
  };
  uint32_t acc = 0;
  uint4 cur[4] = {}, nxt[4] = {};
  int64_t c0 = chunk_of(0);
  if (c0 >= 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) cur[i] = cuda::ld_stream_u4(src + c0 * kChunkWords + i * 256 + tid);
  }
  for (uint32_t k = 1; c0 >= 0; ++k) {
    const int64_t c1 = chunk_of(k);
    if (c1 >= 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) nxt[i] = cuda::ld_stream_u4(src + c1 * kChunkWords + i * 256 + tid);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc ^= cur[i].x ^ cur[i].y ^ cur[i].z ^ cur[i].w;
      cur[i] = nxt[i];
    }
    c0 = c1;
  }
  if (acc == 0x9e3779b9u && tid == 1023) sink->x = acc;  // tid < 256: never true
}

}  // namespace

void bench_read_patterns(int sms, size_t l2_bytes, int reps, int trials, const ReportFn& report) {
  struct Row {
    int64_t bytes;
    int blocks_per_sm;
    int64_t uc;  // chunks per unit; 0 = one slice per block
    const char* what;
  };
  const int64_t kAttn = 134217728, kGemv = 30277632;  // decode attention ctx 32768 (one layer); nf4-dq 4096x14336
  const std::vector<Row> table = {
      {kAttn, 4, 1, "one window"},
      {kAttn, 4, 2, "32 KB units round robin"},
      {kAttn, 4, 4, "64 KB units round robin"},
      {kAttn, 4, 8, "128 KB units round robin"},
      {kAttn, 4, 0, "one slice per block"},
      {kAttn, 8, 0, "one slice per block"},
      {kAttn, 2, 0, "one slice per block"},
      {kGemv, 2, 1, "one window"},
      {kGemv, 2, 2, "32 KB items round robin (gate/up)"},
      {kGemv, 2, 7, "112 KB items (down)"},
      {kGemv, 2, 0, "one slice per block"},
  };
  auto sink = std::unique_ptr<void, void (*)(void*)>(nullptr, [](void* p) { cudaFree(p); });
  {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, 64));
    sink.reset(p);
  }
  int64_t have_bytes = 0;
  std::vector<void*> bufs;
  auto free_bufs = [&] {
    for (void* p : bufs) CUDA_CHECK(cudaFree(p));
    bufs.clear();
  };
  for (const Row& r : table) {
    const int copies = int(std::max<int64_t>(2, int64_t(4 * l2_bytes) / r.bytes + 1));
    if (r.bytes != have_bytes) {  // buffers rotated over >= 4x the L2, reused across rows of one size
      free_bufs();
      for (int c = 0; c < copies; ++c) {
        void* p = nullptr;
        CUDA_CHECK(cudaMalloc(&p, size_t(r.bytes)));
        CUDA_CHECK(cudaMemset(p, c + 1, size_t(r.bytes)));
        bufs.push_back(p);
      }
      have_bytes = r.bytes;
      CUDA_CHECK(cudaDeviceSynchronize());
    }
    const uint32_t nch = uint32_t(r.bytes / (16 * kChunkWords));
    const uint32_t G = uint32_t(r.blocks_per_sm * sms);
    const uint32_t uc = r.uc ? uint32_t(r.uc) : (nch + G - 1) / G;
    const double sec = time_stream_graph(
        [&](int i, cudaStream_t st) {
          read_units_kernel<<<G, 256, 0, st>>>(static_cast<const uint4*>(bufs[size_t(i % copies)]), nch, uc,
                                               static_cast<uint4*>(sink.get()));
        },
        reps, trials);
    report(cat("read units ", r.bytes >> 20, " MiB G=", G, " unit=", uc, "x16KB (", r.what, ")"), sec, double(r.bytes),
           {{"bytes", r.bytes}, {"blocks", G}, {"unit_chunks", uc}, {"chunk_bytes", 16 * kChunkWords},
            {"pattern", r.what}});
  }
  free_bufs();
}

}  // namespace nf4flash::kbench
