// nf4flash-kernel-bench: the 4-bit decode GEMV's code-decode forms. The backend's decode kernel
// (gemv_q4_decode_kernel, T = 1, nf4-dq, bf16) instantiated with each way of turning a tile's four
// code words into mma fragments (gemv_q4.cuh, q4_tile_mma_prmt): PW words through the register
// table (byte permutes), the rest through the per-lane shared byte table (the FLUTE-style
// replicated table; none with PW = 4).
// Every form runs the default's work order, loads and arithmetic, so its output must equal the
// backend's bit for bit; each row says whether it did, and the kernel's registers and spills
// (local bytes). decode_forms returns the forms that differed ("" when none).
// Shapes: Llama-3-8B's 4096x14336 and 14336x4096, and Qwen3-30B-A3B's q/k/v (5120x2048) and o_proj
// (2048x4096), one or two row tiles a block; weights rotated over copies past the L2.
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/kernels/gemv_q4_decode.cuh"
#include "bench.h"
#include "forms.h"
#include "core/error.h"

namespace nf4flash::kbench {
namespace {

using cuda::Q4DecodeArgs;

struct Form {
  const char* name;
  void (*kernel)(Q4DecodeArgs);
  int lut_bytes;  // dynamic shared memory before x
};

template <int PW>
Form form(const char* name) {
  return {name, cuda::gemv_q4_decode_kernel<__nv_bfloat16, true, true, true, PW>, cuda::decode_lut_bytes(PW)};
}

const std::vector<Form>& forms() {
  static const std::vector<Form> f = {
      form<cuda::kDecodePrmtWords>("default (1 register-table word, 3 shared-table words)"),
      form<0>("shared table, 4 words"),
      form<2>("2 register-table, 2 shared-table words"),
      form<4>("register table, 4 words (no shared table)"),
  };
  return f;
}

// Blocks per multiprocessor of a form at its largest dynamic shared memory (set once per form).
int blocks_per_sm(const Form& f, int smem) {
  cuda_check(cudaFuncSetAttribute(f.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem opt-in");
  int v = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, f.kernel, cuda::kDecodeW * 32, smem), "occupancy");
  return v > 0 ? v : 1;
}

// The rows of one shape; the names of the forms whose output differed go to `differ`.
void shape_rows(Context& c, int64_t rows, int64_t cols, std::vector<std::string>& differ) {
  Backend& be = c.be;
  cudaStream_t st = backend_stream(be, "decode forms");
  const auto ws = q4_copies(c, rows, cols);
  auto xb = randn_bf16(be, size_t(cols), c.rng);
  auto ref = be.alloc(size_t(rows) * 2), out = be.alloc(size_t(rows) * 2);
  const Act x = xb->as_act(DType::BF16, 1, cols), ref_a = ref->as_act(DType::BF16, 1, rows);
  be.linear(x, *ws[0], nullptr, ref_a);
  std::vector<uint16_t> want(static_cast<size_t>(rows)), got(static_cast<size_t>(rows));
  be.download(want.data(), ref->data(), want.size() * 2);

  // the kernel arguments of each weight copy, as the backend's launcher makes them
  std::vector<Q4DecodeArgs> args;
  for (const auto& w : ws) {
    cuda::GemvQ4DecodeArgs g;
    g.w[0] = &tiled_q4(*w, "decode forms");
    g.out[0] = out->data();
    g.x = xb->data();
    g.T = 1;
    Q4DecodeArgs k = cuda::gemv_q4_decode_kernel_args(g);
    k.x_stride = cuda::decode_x_stride(k.cols);
    args.push_back(k);
  }
  const double bytes = double(ws[0]->resident_bytes()) + 2.0 * double(cols + rows);
  for (const Form& f : forms()) {
    const int smem = f.lut_bytes + args[0].x_stride;
    const int grid = int(std::min<int64_t>(args[0].units, int64_t(blocks_per_sm(f, smem)) * c.prop.multiProcessorCount));
    cudaFuncAttributes fa{};
    cuda_check(cudaFuncGetAttributes(&fa, f.kernel), "kernel attributes");
    auto body = [&](int i) {
      cuda::launch_k(f.kernel, dim3(unsigned(grid)), dim3(cuda::kDecodeW * 32), size_t(smem), st,
                     args[size_t(i) % args.size()]);
      cuda_check(cudaGetLastError(), f.name);
    };
    cuda_check(cudaMemsetAsync(out->data(), 0xff, size_t(rows) * 2, st), "memset");
    body(0);
    be.download(got.data(), out->data(), got.size() * 2);
    const bool same = std::memcmp(got.data(), want.data(), want.size() * 2) == 0;
    const double sec = time_graph(be, body, c.reps, c.trials);
    c.report.row(cat("gemv nf4-dq ", rows, "x", cols, " T=1 form: ", f.name), sec, bytes, 0,
                 {{"format", "nf4-dq"}, {"T", 1}, {"rows", rows}, {"cols", cols}, {"copies", ws.size()},
                  {"bit_identical_to_backend", same}, {"registers", fa.numRegs}, {"local_bytes", fa.localSizeBytes},
                  {"dynamic_smem", smem}, {"grid", grid}});
    if (!same) differ.push_back(cat(f.name, " at ", rows, "x", cols));
  }
}

}  // namespace

std::string decode_forms(Context& c) {
  c.report.section("decode_forms", "4-bit decode GEMV code-decode forms (T=1, nf4-dq; weights from HBM)");
  std::vector<std::string> differ;
  shape_rows(c, 4096, 14336, differ);
  shape_rows(c, 14336, 4096, differ);
  shape_rows(c, 5120, 2048, differ);
  shape_rows(c, 2048, 4096, differ);
  return differ_list(differ);
}

}  // namespace nf4flash::kbench
