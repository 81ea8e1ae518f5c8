// nf4flash-kernel-bench: the skinny 4-bit GEMM's stage synchronization (built for sm_90a; runs on
// compute capability 9.0). The backend's kernel (gemm_q4_skinny_kernel, nf4-dq, bf16) instantiated
// with its default block barrier a step (6 stages, as its launchers use: steps loaded 5 ahead) and
// with the mbarrier ring (MB: full / empty mbarriers a stage, steps loaded S-2 ahead) of 6 stages
// (4 ahead) and of 7 (5 ahead, as deep as the barrier's): the mma.sync form at 16 rows (2 token
// tiles) and 32 rows (4), the wgmma form at 32 rows. Each runs the same work order and arithmetic,
// so a ring's output must equal the barrier's bit for bit; the barrier form of the backend's own
// choice at those rows (mma.sync at 16, wgmma at 32) must equal the backend's.
// Shapes: a Llama-3-8B layer's single-weight products (4096x4096, 14336x4096, 4096x14336); weights
// rotated over copies past the L2; the two forms of a pair timed alternately, two rounds.
#include <cuda_bf16.h>

#include <string>
#include <vector>

#include "backend/cuda/kernels/gemm_q4_skinny.cuh"
#include "bench.h"
#include "forms.h"
#include "core/error.h"

namespace nf4flash::kbench {
namespace {

using Launch = void (*)(const cuda::GemmQ4SkinnyArgs&, cudaStream_t);

// One form at T rows: the block barrier and the two rings, in that order.
struct FormSet {
  bool wgmma;  // the wgmma form, else mma.sync
  int T;
  Launch sync[3];
  const char* name() const { return wgmma ? "wgmma" : "mma.sync"; }
};
constexpr const char* kSyncName[3] = {"block barrier", "mbarrier ring 6", "mbarrier ring 7"};

template <int NT, bool WG, int S, bool MB>
constexpr Launch launch() {
  return cuda::skinny_launch<__nv_bfloat16, true, NT, S, WG, MB>;
}
template <int NT, bool WG>
constexpr FormSet form_set(int T) {
  return {WG, T, {launch<NT, WG, 6, false>(), launch<NT, WG, 6, true>(), launch<NT, WG, 7, true>()}};
}

const std::vector<FormSet>& form_sets() {
  static const std::vector<FormSet> f = {form_set<2, false>(16), form_set<4, false>(32), form_set<4, true>(32)};
  return f;
}

// The rows of one shape; the forms (or backend comparisons) whose outputs differed go to `differ`.
void shape_rows(Context& c, int64_t rows, int64_t cols, std::vector<std::string>& differ) {
  Backend& be = c.be;
  cudaStream_t st = backend_stream(be, "skinny forms");
  const auto ws = q4_copies(c, rows, cols);
  std::vector<const cuda::Q4Device*> devs;
  for (const auto& w : ws) devs.push_back(&tiled_q4(*w, "skinny forms"));
  constexpr int kMaxT = 32;
  auto xb = randn_bf16(be, size_t(kMaxT * cols), c.rng);
  auto ref = be.alloc(size_t(kMaxT * rows) * 2), out = be.alloc(size_t(kMaxT * rows) * 2);

  // the workspace of the largest launch (32 rows), counters zeroed once: every launch leaves them zero
  cuda::GemmQ4SkinnyArgs g;
  g.w[0] = devs[0];
  g.out[0] = out->data();
  g.x = xb->data();
  g.T = kMaxT;
  const cuda::GemmQ4SkinnyWs need = cuda::gemm_q4_skinny_ws_needed(g);
  auto partial = be.alloc(size_t(need.floats) * 4), tickets = be.alloc(size_t(need.n_tickets) * 4);
  cuda_check(cudaMemsetAsync(tickets->data(), 0, size_t(need.n_tickets) * 4, st), "memset counters");
  g.ws = {static_cast<float*>(partial->data()), need.floats, static_cast<int*>(tickets->data()), need.n_tickets};

  std::vector<uint16_t> want, got[3];
  const double wbytes = double(ws[0]->resident_bytes());
  for (const FormSet& p : form_sets()) {
    const size_t n = size_t(p.T * rows);
    // the backend's own path at these rows, for the barrier form it takes
    const bool backend_form = (p.T > 16) == p.wgmma;
    if (backend_form) {
      be.linear(xb->as_act(DType::BF16, p.T, cols), *ws[0], nullptr, ref->as_act(DType::BF16, p.T, rows));
      want.resize(n);
      be.download(want.data(), ref->data(), n * 2);
    }
    auto run = [&](Launch l, int i) {
      cuda::GemmQ4SkinnyArgs a = g;
      a.w[0] = devs[size_t(i) % devs.size()];
      a.T = p.T;
      l(a, st);
      cuda_check(cudaGetLastError(), p.name());
    };
    auto output = [&](Launch l, std::vector<uint16_t>& v) {
      cuda_check(cudaMemsetAsync(out->data(), 0xff, n * 2, st), "memset");
      run(l, 0);
      v.resize(n);
      be.download(v.data(), out->data(), n * 2);
    };
    for (int k = 0; k < 3; ++k) output(p.sync[k], got[k]);
    const bool backend_same = !backend_form || got[0] == want;
    const double bytes = wbytes + 2.0 * double(p.T) * double(cols + rows);
    for (int round = 1; round <= 2; ++round)
      for (int k = 0; k < 3; ++k) {
        const double sec = time_graph(be, [&](int i) { run(p.sync[k], i); }, c.reps, c.trials);
        c.report.row(cat("skinny nf4-dq ", rows, "x", cols, " T=", p.T, " ", p.name(), " ", kSyncName[k], " (", round, ")"),
                     sec, bytes, 0,
                     {{"format", "nf4-dq"}, {"T", p.T}, {"rows", rows}, {"cols", cols}, {"form", p.name()},
                      {"sync", kSyncName[k]}, {"round", round}, {"copies", ws.size()},
                      {"bit_identical_to_barrier_form", got[k] == got[0]},
                      {"bit_identical_to_backend", backend_form ? nlohmann::json(backend_same) : nlohmann::json(nullptr)}});
      }
    for (int k = 1; k < 3; ++k)
      if (got[k] != got[0]) differ.push_back(cat(p.name(), " ", kSyncName[k], " at ", rows, "x", cols, " T=", p.T));
    if (!backend_same) differ.push_back(cat(p.name(), " block barrier vs backend at ", rows, "x", cols, " T=", p.T));
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
  return differ_list(differ);
}

}  // namespace nf4flash::kbench
