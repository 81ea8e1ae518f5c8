// nf4flash-kernel-bench: the skinny 4-bit GEMM's stage synchronization (built for sm_90a; runs on
// compute capability 9.0). The backend's kernel (gemm_q4_skinny_kernel, nf4-dq, bf16, 6 stages as
// its launchers use) instantiated with the default block barrier a step and with the mbarrier ring
// (MB: full / empty mbarriers a stage, steps loaded 4 ahead instead of 5): the mma.sync form at 16
// rows (2 token tiles) and 32 rows (4), the wgmma form at 32 rows. Each pair runs the same work
// order and arithmetic, so the ring's output must equal the barrier's bit for bit; the barrier form
// of the backend's own choice at those rows (mma.sync at 16, wgmma at 32) must equal the backend's.
// Shapes: a Llama-3-8B layer's single-weight products (4096x4096, 14336x4096, 4096x14336); weights
// rotated over copies past the L2; the two forms of a pair timed alternately, two rounds.
#include <cuda_bf16.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_resources.h"
#include "backend/cuda/kernels/gemm_q4_skinny.cuh"
#include "bench.h"
#include "core/error.h"

namespace nf4flash::kbench {
namespace {

using Launch = void (*)(const cuda::GemmQ4SkinnyArgs&, cudaStream_t);

struct Pair {
  const char* form;  // "mma.sync" or "wgmma"
  int T;
  Launch barrier, ring;
};

template <int NT, bool WG, bool MB>
constexpr Launch launch() {
  return cuda::skinny_launch<__nv_bfloat16, true, NT, 6, WG, MB>;
}

const std::vector<Pair>& pairs() {
  static const std::vector<Pair> p = {
      {"mma.sync", 16, launch<2, false, false>(), launch<2, false, true>()},
      {"mma.sync", 32, launch<4, false, false>(), launch<4, false, true>()},
      {"wgmma", 32, launch<4, true, false>(), launch<4, true, true>()},
  };
  return p;
}

const cuda::Q4Device& q4_dev(const Weight& w) {
  auto* q = dynamic_cast<const cuda_impl::CudaQ4*>(&w);
  NF4FLASH_CHECK(q && !q->fallback, "skinny forms: expected a tiled 4-bit CUDA weight");
  return q->dev;
}

// The rows of one shape; the pairs (or backend comparisons) whose outputs differed go to `differ`.
void shape_rows(Context& c, int64_t rows, int64_t cols, std::vector<std::string>& differ) {
  Backend& be = c.be;
  auto* st = static_cast<cudaStream_t>(be.native_stream());
  NF4FLASH_CHECK(st, "skinny forms: the backend has no CUDA stream");
  const auto host = random_q4(rows, cols, true, c.rng);
  std::vector<std::unique_ptr<Weight>> ws(size_t(c.copies_for(double(rows * cols) / 2)));
  for (auto& w : ws) w = be.upload_quant4(host);
  constexpr int kMaxT = 32;
  auto xb = randn_bf16(be, size_t(kMaxT * cols), c.rng);
  auto ref = be.alloc(size_t(kMaxT * rows) * 2), out = be.alloc(size_t(kMaxT * rows) * 2);

  // the workspace of the largest launch (32 rows), counters zeroed once: every launch leaves them zero
  cuda::GemmQ4SkinnyArgs g;
  g.w[0] = &q4_dev(*ws[0]);
  g.out[0] = out->data();
  g.x = xb->data();
  g.T = kMaxT;
  const cuda::GemmQ4SkinnyWs need = cuda::gemm_q4_skinny_ws_needed(g);
  auto partial = be.alloc(size_t(need.floats) * 4), tickets = be.alloc(size_t(need.n_tickets) * 4);
  cuda_check(cudaMemsetAsync(tickets->data(), 0, size_t(need.n_tickets) * 4, st), "memset counters");
  g.ws = {static_cast<float*>(partial->data()), need.floats, static_cast<int*>(tickets->data()), need.n_tickets};

  std::vector<uint16_t> want, got_b, got_r;
  const double wbytes = double(ws[0]->resident_bytes());
  for (const Pair& p : pairs()) {
    const size_t n = size_t(p.T * rows);
    // the backend's own path at these rows, for the barrier form it takes
    const bool backend_form = (p.T > 16) == (std::strcmp(p.form, "wgmma") == 0);
    if (backend_form) {
      be.linear(xb->as_act(DType::BF16, p.T, cols), *ws[0], nullptr, ref->as_act(DType::BF16, p.T, rows));
      want.resize(n);
      be.download(want.data(), ref->data(), n * 2);
    }
    auto run = [&](Launch l, int i) {
      cuda::GemmQ4SkinnyArgs a = g;
      a.w[0] = &q4_dev(*ws[size_t(i) % ws.size()]);
      a.T = p.T;
      a.wgmma = std::strcmp(p.form, "wgmma") == 0;
      l(a, st);
      cuda_check(cudaGetLastError(), p.form);
    };
    auto output = [&](Launch l, std::vector<uint16_t>& v) {
      cuda_check(cudaMemsetAsync(out->data(), 0xff, n * 2, st), "memset");
      run(l, 0);
      v.resize(n);
      be.download(v.data(), out->data(), n * 2);
    };
    output(p.barrier, got_b);
    output(p.ring, got_r);
    const bool ring_same = got_r == got_b, backend_same = !backend_form || got_b == want;
    const double bytes = wbytes + 2.0 * double(p.T) * double(cols + rows);
    for (int round = 1; round <= 2; ++round)
      for (int ring = 0; ring < 2; ++ring) {
        const Launch l = ring ? p.ring : p.barrier;
        const double sec = time_graph(be, [&](int i) { run(l, i); }, c.reps, c.trials);
        c.report.row(cat("skinny nf4-dq ", rows, "x", cols, " T=", p.T, " ", p.form, ring ? " mbarrier ring" : " block barrier",
                         " (", round, ")"),
                     sec, bytes, 0,
                     {{"format", "nf4-dq"}, {"T", p.T}, {"rows", rows}, {"cols", cols}, {"form", p.form},
                      {"sync", ring ? "mbarrier" : "barrier"}, {"round", round}, {"copies", ws.size()},
                      {"bit_identical_to_barrier_form", ring ? ring_same : true},
                      {"bit_identical_to_backend", backend_form ? nlohmann::json(backend_same) : nlohmann::json(nullptr)}});
      }
    if (!ring_same) differ.push_back(cat(p.form, " ring at ", rows, "x", cols, " T=", p.T));
    if (!backend_same) differ.push_back(cat(p.form, " barrier vs backend at ", rows, "x", cols, " T=", p.T));
  }
}

}  // namespace

std::string skinny_forms(Context& c) {
  c.report.section("skinny_forms", "skinny 4-bit GEMM stage synchronization (nf4-dq, bf16; weights from HBM)");
  if (c.prop.major != 9 || c.prop.minor != 0 || !cuda::gemm_q4_skinny_wgmma_supported()) {
    std::printf("skinny forms skipped: they need a compute capability 9.0 GPU (this one: %d.%d)\n", c.prop.major,
                c.prop.minor);
    return "";
  }
  std::vector<std::string> differ;
  shape_rows(c, 4096, 4096, differ);
  shape_rows(c, 14336, 4096, differ);
  shape_rows(c, 4096, 14336, differ);
  std::string list;
  for (const auto& d : differ) list += (list.empty() ? "" : "; ") + d;
  return list;
}

}  // namespace nf4flash::kbench
