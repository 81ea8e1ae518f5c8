// CUDA ops against the CPU f32 backend on fresh random inputs: elementwise ops, RoPE, KV cache +
// attention (decode and prefill, GQA, head_dim 64/128, pos0 > 0), graphs, sampling (greedy and
// temperature/top-k/top-p/min-p/penalty against the host's sample_with_uniform; the pipelined
// loop's sample_to_device against sample()).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string_view>

#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "ops/cuda_test_util.h"
#include "quant/blockwise.h"
#include "sampling/sampler.h"

namespace nf4flash::test {
namespace {

void run_elementwise(DType dt) {
  Backends b(dt);
  // rms_norm: row kernel (cols 3000, 4096, 8192), block kernel (9000 bf16), warp kernel (per-head
  // views, cols 64 / 128)
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 3000}, {21, 128}, {10, 64}, {2, 4096}, {2, 8192}, {2, 9000}}) {
    auto X = rounded(randn(size_t(rows * cols), 3.f), dt);
    auto Wn = randn(size_t(cols), 1.f);
    auto wc = b.cpu->upload_dense(f32_tensor(Wn, {cols}), DType::F32);
    auto wg = b.gpu->upload_dense(f32_tensor(Wn, {cols}), dt);
    DevAct xc(*b.cpu, rows, cols), xg(*b.gpu, rows, cols), yc(*b.cpu, rows, cols), yg(*b.gpu, rows, cols);
    xc.set(X);
    xg.set(X);
    yg.poison();
    b.cpu->rms_norm(xc.act, *wc, 1e-5f, yc.act);
    b.gpu->rms_norm(xg.act, *wg, 1e-5f, yg.act);
    EXPECT_LT(rel_err(yg.get(), yc.get()), tol_for(dt)) << "rms_norm " << rows << "x" << cols;
    b.gpu->rms_norm(xg.act, *wg, 1e-5f, xg.act);  // in place
    EXPECT_LT(rel_err(xg.get(), yc.get()), tol_for(dt)) << "rms_norm in place";
  }
  // add_rms_norm: x += d, out = rms_norm(x); the row kernel (V = 1, 2, 4 chunks per thread), rows
  // too long for it (9000 bf16) and a width that is no whole number of 16-byte chunks (composition)
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 4096}, {5, 3000}, {2, 8192}, {3, 96}, {2, 9000}, {3, 4100}}) {
    auto X = rounded(randn(size_t(rows * cols), 3.f), dt), D = rounded(randn(size_t(rows * cols)), dt);
    auto Wn = randn(size_t(cols), 1.f);
    auto wc = b.cpu->upload_dense(f32_tensor(Wn, {cols}), DType::F32);
    auto wg = b.gpu->upload_dense(f32_tensor(Wn, {cols}), dt);
    DevAct xc(*b.cpu, rows, cols), dc(*b.cpu, rows, cols), yc(*b.cpu, rows, cols);
    DevAct xg(*b.gpu, rows, cols), dg(*b.gpu, rows, cols), yg(*b.gpu, rows, cols);
    xc.set(X); dc.set(D); xg.set(X); dg.set(D);
    yg.poison();
    b.cpu->add_rms_norm(xc.act, dc.act, *wc, 1e-5f, yc.act);
    b.gpu->add_rms_norm(xg.act, dg.act, *wg, 1e-5f, yg.act);
    EXPECT_LT(rel_err(xg.get(), xc.get()), tol_for(dt)) << "add_rms_norm sum " << rows << "x" << cols;
    EXPECT_LT(rel_err(yg.get(), yc.get()), tol_for(dt)) << "add_rms_norm norm " << rows << "x" << cols;
  }
  // silu_mul, add: odd sizes (scalar kernels) and whole 16-byte chunks (vector kernels); add in place
  for (int64_t n : {int64_t{4099}, int64_t{3 * 4096}}) {
    auto G = rounded(randn(n, 2.f), dt), U = rounded(randn(n), dt);
    DevAct gc(*b.cpu, 1, n), uc(*b.cpu, 1, n), oc(*b.cpu, 1, n), gg(*b.gpu, 1, n), ug(*b.gpu, 1, n), og(*b.gpu, 1, n);
    gc.set(G); uc.set(U); gg.set(G); ug.set(U);
    og.poison();
    b.cpu->silu_mul(gc.act, uc.act, oc.act);
    b.gpu->silu_mul(gg.act, ug.act, og.act);
    EXPECT_LT(rel_err(og.get(), oc.get()), tol_for(dt)) << "silu_mul n " << n;
    b.cpu->add(gc.act, uc.act, gc.act);
    b.gpu->add(gg.act, ug.act, gg.act);
    EXPECT_LT(rel_err(gg.get(), gc.get()), tol_for(dt)) << "add n " << n;
  }
  // embed
  const int64_t vocab = 1001, hidden = 96;
  auto E = randn(size_t(vocab * hidden));
  auto ec = b.cpu->upload_dense(f32_tensor(E, {vocab, hidden}), DType::F32);
  auto eg = b.gpu->upload_dense(f32_tensor(E, {vocab, hidden}), dt);
  std::vector<int32_t> ids = {5, 1000, 0, 77, 5, 999, 123};
  DevInts ic(*b.cpu, ids), ig(*b.gpu, ids);
  DevAct ac(*b.cpu, int64_t(ids.size()), hidden), ag(*b.gpu, int64_t(ids.size()), hidden);
  ag.poison();
  b.cpu->embed(*ec, ic.ptr(), ac.act);
  b.gpu->embed(*eg, ig.ptr(), ag.act);
  EXPECT_LT(rel_err(ag.get(), ac.get()), tol_for(dt)) << "embed";
  // a vocabulary shard, rows [50, 1000): ids 77, 999, 123 give their rows, 5, 0 and 1000 zeros,
  // on both backends
  const std::vector<float> part(E.begin() + 50 * hidden, E.begin() + 1000 * hidden);
  auto sc = b.cpu->upload_dense(f32_tensor(part, {950, hidden}), DType::F32);
  auto sg = b.gpu->upload_dense(f32_tensor(part, {950, hidden}), dt);
  DevAct sca(*b.cpu, int64_t(ids.size()), hidden), sga(*b.gpu, int64_t(ids.size()), hidden);
  sga.poison();
  b.cpu->embed(*sc, ic.ptr(), sca.act, 50);
  b.gpu->embed(*sg, ig.ptr(), sga.act, 50);
  const std::vector<float> full = ac.get(), shard_cpu = sca.get(), shard_gpu = sga.get();
  for (size_t t = 0; t < ids.size(); ++t) {
    const bool mine = ids[t] >= 50 && ids[t] < 1000;
    for (int64_t c = 0; c < hidden; ++c) {
      const size_t i = t * size_t(hidden) + size_t(c);
      EXPECT_EQ(shard_cpu[i], mine ? full[i] : 0.0f) << "cpu shard, id " << ids[t];
      if (!mine) EXPECT_EQ(shard_gpu[i], 0.0f) << "gpu shard, id " << ids[t];
    }
  }
  EXPECT_LT(rel_err(shard_gpu, shard_cpu), tol_for(dt)) << "embed shard";
}

TEST(CudaOps, Elementwise) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) run_elementwise(dt);
}

TEST(CudaOps, Rope) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F32})
    for (int hd : {64, 128})
      for (int pos0 : {0, 37, 5000}) {
        Backends b(dt);
        const int64_t T = 5, nq = 4, nk = 2;
        std::vector<float> inv(size_t(hd / 2));
        for (int i = 0; i < hd / 2; ++i) inv[size_t(i)] = std::pow(500000.f, -2.f * i / hd);
        auto Q = rounded(randn(size_t(T * nq * hd)), dt), K = rounded(randn(size_t(T * nk * hd)), dt);
        DevAct qc(*b.cpu, T, nq * hd), kc(*b.cpu, T, nk * hd), qg(*b.gpu, T, nq * hd), kg(*b.gpu, T, nk * hd);
        DevAct ifc(*b.cpu, 1, hd / 2, DType::F32), ifg(*b.gpu, 1, hd / 2, DType::F32);
        ifc.set(inv); ifg.set(inv);
        qc.set(Q); kc.set(K); qg.set(Q); kg.set(K);
        DevInts pc(*b.cpu, {pos0}), pg(*b.gpu, {pos0});
        RopeParams rc{hd, static_cast<const float*>(ifc.act.data)}, rg{hd, static_cast<const float*>(ifg.act.data)};
        b.cpu->rope(qc.act, kc.act, rc, StepState{pc.ptr()});
        b.gpu->rope(qg.act, kg.act, rg, StepState{pg.ptr()});
        EXPECT_LT(rel_err(qg.get(), qc.get()), tol_for(dt)) << "rope q hd=" << hd << " pos0=" << pos0;
        EXPECT_LT(rel_err(kg.get(), kc.get()), tol_for(dt)) << "rope k hd=" << hd << " pos0=" << pos0;
      }
}

struct AttnCase {
  int n_heads, n_kv, hd, pos0, T;
};

void run_attention(DType dt, const AttnCase& c) {
  Backends b(dt);
  const int64_t cap = c.pos0 + c.T + 5, kvw = int64_t(c.n_kv) * c.hd, qw = int64_t(c.n_heads) * c.hd;
  const int layers = 2, layer = 1;
  b.cpu->kv_allocate({layers, c.n_kv, c.hd, cap, DType::F32});
  b.gpu->kv_allocate({layers, c.n_kv, c.hd, cap, dt});
  auto fill = [&](int64_t T, int32_t p0) {
    auto K = rounded(randn(size_t(T * kvw)), dt), V = rounded(randn(size_t(T * kvw)), dt);
    DevAct kc(*b.cpu, T, kvw), vc(*b.cpu, T, kvw), kg(*b.gpu, T, kvw), vg(*b.gpu, T, kvw);
    kc.set(K); vc.set(V); kg.set(K); vg.set(V);
    DevInts pc(*b.cpu, {p0}), pg(*b.gpu, {p0});
    b.cpu->kv_write(layer, kc.act, vc.act, StepState{pc.ptr()});
    b.gpu->kv_write(layer, kg.act, vg.act, StepState{pg.ptr()});
  };
  if (c.pos0 > 0) fill(c.pos0, 0);  // the existing context
  fill(c.T, c.pos0);                // this step's rows
  auto Q = rounded(randn(size_t(c.T * qw), 2.f), dt);
  DevAct qc(*b.cpu, c.T, qw), qg(*b.gpu, c.T, qw), oc(*b.cpu, c.T, qw), og(*b.gpu, c.T, qw);
  qc.set(Q); qg.set(Q);
  og.poison();
  DevInts pc(*b.cpu, {c.pos0}), pg(*b.gpu, {c.pos0});
  AttnParams p{c.n_heads, c.n_kv, c.hd, 1.f / std::sqrt(float(c.hd)), AttnImpl::Auto};
  b.cpu->attention(layer, qc.act, oc.act, p, StepState{pc.ptr()});
  b.gpu->attention(layer, qg.act, og.act, p, StepState{pg.ptr()});
  EXPECT_LT(rel_err(og.get(), oc.get()), tol_for(dt)) << "attention heads " << c.n_heads << "/" << c.n_kv
                                                   << " hd " << c.hd << " pos0 " << c.pos0 << " T " << c.T;
  if (c.T <= cuda::kDecodeMaxRows) {  // decode: a second launch (workspace reused) gives the same bits
    const auto first = og.get();
    og.poison();
    b.gpu->attention(layer, qg.act, og.act, p, StepState{pg.ptr()});
    EXPECT_EQ(og.get(), first) << "decode attention repeated, heads " << c.n_heads << "/" << c.n_kv << " pos0 " << c.pos0;
  }
}

TEST(CudaOps, AttentionDecode) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (AttnCase c : {AttnCase{8, 2, 128, 0, 1}, AttnCase{8, 2, 64, 50, 1}, AttnCase{32, 8, 128, 3000, 1},
                       AttnCase{14, 2, 64, 700, 1}, AttnCase{4, 4, 128, 33, 3}, AttnCase{16, 1, 64, 257, 4},
                       AttnCase{12, 2, 128, 1, 2}, AttnCase{32, 8, 128, 20000, 1}, AttnCase{8, 2, 64, 9001, 3}})
      run_attention(dt, c);
}

TEST(CudaOps, AttentionPrefill) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (AttnCase c : {AttnCase{8, 2, 128, 0, 17}, AttnCase{8, 2, 64, 50, 33}, AttnCase{4, 4, 128, 0, 128},
                       AttnCase{14, 2, 64, 100, 100}, AttnCase{8, 8, 64, 0, 5}})
      run_attention(dt, c);
  run_attention(DType::F32, AttnCase{6, 2, 128, 20, 40});
}

TEST(CudaOps, AttentionUnsupported) {
  NF4FLASH_REQUIRE_CUDA();
  Backends b;
  EXPECT_NE(b.gpu->attn_unsupported_reason(AttnImpl::Auto, 48).find("48"), std::string::npos);
  EXPECT_EQ(b.gpu->attn_unsupported_reason(AttnImpl::Auto, 128), "");
  EXPECT_EQ(b.gpu->attn_unsupported_reason(AttnImpl::Sdpa, 64), "");
}

// A captured step (norm -> 4-bit linear -> rope -> kv_write -> attention -> add) replayed at a
// new position gives what running it eagerly there gives.
TEST(CudaOps, GraphReplay) {
  NF4FLASH_REQUIRE_CUDA();
  Backends b;
  auto& g = *b.gpu;
  ASSERT_TRUE(g.graphs_supported());
  const int64_t H = 256, hd = 64, nh = 4, nkv = 2;
  g.kv_allocate({1, int(nkv), int(hd), 64, DType::BF16});
  auto Wq = randn(size_t(nh * hd * H), 0.05f), Wk = randn(size_t(nkv * hd * H), 0.05f), Nw = randn(size_t(H));
  auto qq = std::make_shared<Quant4Tensor>(quantize_4bit(Wq.data(), DType::F32, nh * hd, H, QuantType::NF4, 64, true));
  auto qk = std::make_shared<Quant4Tensor>(quantize_4bit(Wk.data(), DType::F32, nkv * hd, H, QuantType::NF4, 64, true));
  auto wq = g.upload_quant4(qq), wk = g.upload_quant4(qk);
  auto nw = g.upload_dense(f32_tensor(Nw, {H}), DType::BF16);
  std::vector<float> inv(size_t(hd / 2));
  for (int i = 0; i < hd / 2; ++i) inv[size_t(i)] = std::pow(10000.f, -2.f * i / hd);
  DevAct invd(g, 1, hd / 2, DType::F32), x(g, 1, H), xn(g, 1, H), q(g, 1, nh * hd), k(g, 1, nkv * hd), o(g, 1, nh * hd);
  invd.set(inv);
  DevInts pos(g, {0});
  StepState s{pos.ptr()};
  RopeParams rp{int(hd), static_cast<const float*>(invd.act.data)};
  AttnParams ap{int(nh), int(nkv), int(hd), 0.125f, AttnImpl::Auto};
  auto step = [&] {
    g.rms_norm(x.act, *nw, 1e-6f, xn.act);
    g.linear(xn.act, *wq, nullptr, q.act);
    g.linear(xn.act, *wk, nullptr, k.act);
    g.rope(q.act, k.act, rp, s);
    g.kv_write(0, k.act, k.act, s);
    g.attention(0, q.act, o.act, ap, s);
    g.add(o.act, q.act, o.act);
  };
  // positions 0..9 eagerly, remember the outputs at 7..9
  std::vector<std::vector<float>> xs, eager;
  for (int p = 0; p < 10; ++p) {
    g.upload(pos.ptr(), &p, 4);
    xs.push_back(rounded(randn(size_t(H)), DType::BF16));
    x.set(xs.back());
    step();
    eager.push_back(o.get());
  }
  // replay the same steps from position 7 with a graph captured once
  int p = 7;
  g.upload(pos.ptr(), &p, 4);
  x.set(xs[7]);
  g.capture_begin();
  step();
  const int id = g.capture_end();
  for (p = 7; p < 10; ++p) {
    g.upload(pos.ptr(), &p, 4);
    x.set(xs[size_t(p)]);
    g.replay(id);
    g.sync();
    EXPECT_LT(rel_err(o.get(), eager[size_t(p)]), 1e-6) << "graph replay at position " << p;
  }
}

TEST(CudaOps, SampleGreedy) {
  NF4FLASH_REQUIRE_CUDA();
  Backends b;
  const int64_t vocab = 128257;
  auto L = randn(size_t(vocab), 3.f);
  DevAct lg(*b.gpu, 1, vocab, DType::F32);
  lg.set(L);
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (L[size_t(i)] > L[size_t(best)]) best = i;
  SamplingParams sp;
  int32_t id = -1;
  ASSERT_TRUE(b.gpu->sample(lg.act, sp, nullptr, 0, 0.5f, &id));
  EXPECT_EQ(id, best);
  // repetition penalty on the best id (twice in the host history: applied once) moves the choice
  std::vector<int32_t> hist = {int32_t(best), 3, int32_t(best)};
  sp.repeat_penalty = 1e6f;
  ASSERT_TRUE(b.gpu->sample(lg.act, sp, hist.data(), 3, 0.5f, &id));
  std::vector<float> P = L;
  for (int32_t h : {int32_t(best), 3}) P[size_t(h)] = P[size_t(h)] < 0 ? P[size_t(h)] * 1e6f : P[size_t(h)] / 1e6f;
  int64_t best2 = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (P[size_t(i)] > P[size_t(best2)]) best2 = i;
  EXPECT_EQ(id, best2);
  EXPECT_EQ(id, sample_with_uniform(L.data(), vocab, sp, hist, 0.5f));
}

// The device sampler picks sample_with_uniform's id for the same logits and u, for every parameter
// set, except where u * total lies within 1e-9 (relative) of a cumulative boundary of the host's
// walk (the device sums in another order).
TEST(CudaOps, SampleMatchesHost) {
  NF4FLASH_REQUIRE_CUDA();
  Backends b;
  int checked = 0, skipped = 0;
  for (int64_t vocab : {int64_t(128256), int64_t(1001)}) {
    auto L = randn(size_t(vocab), 3.f);
    // exact ties: among random tokens, and with the maximum
    for (int64_t i = 10; i < 20; ++i) L[size_t(i)] = L[5];
    const int64_t top = std::max_element(L.begin(), L.end()) - L.begin();
    L[size_t(vocab - 2)] = L[size_t(top)];
    L[size_t(vocab / 2)] = L[size_t(top)];
    DevAct lg(*b.gpu, 1, vocab, DType::F32);
    lg.set(L);
    const std::vector<int32_t> hist = {5, 7, 5, 100, int32_t(top), 7, 3, int32_t(vocab - 1), 5, int32_t(vocab / 2)};
    std::vector<float> us;
    for (int j = 0; j < 48; ++j) us.push_back((j + 0.37f) / 48.f);
    us.push_back(0.0f);
    us.push_back(std::nextafter(1.0f, 0.0f));
    for (float T : {0.0f, 0.7f, 1.0f, 1.5f})
      for (int k : {0, 1, 40, 1000, 5000})
        for (float top_p : {1.0f, 0.9f, 0.5f})
          for (float min_p : {0.0f, 0.05f})
            for (float pen : {1.0f, 1.3f}) {
              if (T == 0.0f && (k || top_p < 1 || min_p > 0)) continue;
              SamplingParams sp;
              sp.temperature = T;
              sp.top_k = k;
              sp.top_p = top_p;
              sp.min_p = min_p;
              sp.repeat_penalty = pen;
              SampleCandidates c;
              sample_candidates(L.data(), vocab, sp, hist.data(), hist.size(), c);
              double total = 0;
              for (double w : c.w) total += w;
              for (float u : us) {
                // the host's cumulative boundaries near r
                const double r = double(u) * total;
                double cum = 0;
                bool near = false;
                for (double w : c.w) {
                  cum += w;
                  if (std::fabs(cum - r) <= 1e-9 * total) near = true;
                }
                if (near && !sp.greedy()) {
                  ++skipped;
                  continue;
                }
                int32_t id = -1;
                ASSERT_TRUE(b.gpu->sample(lg.act, sp, hist.data(), int(hist.size()), u, &id));
                const int32_t want = draw_with_uniform(c, u);
                ASSERT_EQ(id, want) << "vocab " << vocab << " T " << T << " top_k " << k << " top_p " << top_p
                                    << " min_p " << min_p << " penalty " << pen << " u " << u << " kept "
                                    << c.ids.size();
                ++checked;
              }
            }
  }
  std::printf("[sample] %d draws equal to the host's, %d skipped at a boundary\n", checked, skipped);
  EXPECT_LT(skipped, checked / 100 + 1);
}

// sample_to_device (the pipelined decode loop): the id sample() picks for the same logits and u,
// with every slot queued before any is read, handed to the next step's id buffer and position;
// with the repetition penalty, over a history in device memory that each call appends to.
TEST(CudaOps, SampleToDeviceQueuesTheSameIds) {
  NF4FLASH_REQUIRE_CUDA();
  Backends b;
  const int64_t vocab = 128256;
  constexpr int S = Backend::kSampleSlots;
  std::vector<std::unique_ptr<DevAct>> lg;
  for (int i = 0; i < S; ++i) {
    lg.push_back(std::make_unique<DevAct>(*b.gpu, 1, vocab, DType::F32));
    lg.back()->set(randn(size_t(vocab), 3.f));
  }
  auto ids = b.gpu->alloc(4), pos = b.gpu->alloc(4);
  int32_t* ids_d = static_cast<int32_t*>(ids->data());
  int32_t* pos_d = static_cast<int32_t*>(pos->data());
  const int32_t p0 = 17, id0 = -5;
  b.gpu->upload(pos_d, &p0, 4);
  b.gpu->upload(ids_d, &id0, 4);
  int round = 0;
  for (float T : {0.0f, 0.8f}) {
    SamplingParams sp;
    sp.temperature = T;
    sp.top_k = T > 0 ? 50 : 0;
    sp.top_p = T > 0 ? 0.9f : 1.0f;
    auto u = [](int i) { return 0.31f + 0.17f * float(i); };
    for (int i = 0; i < S; ++i) ASSERT_TRUE(b.gpu->sample_to_device(lg[size_t(i)]->act, sp, u(i), ids_d, pos_d, i));
    ++round;
    int32_t last = -1;
    for (int i = 0; i < S; ++i) {
      const int32_t got = b.gpu->sampled(i);
      int32_t want = -1;
      ASSERT_TRUE(b.gpu->sample(lg[size_t(i)]->act, sp, nullptr, 0, u(i), &want));
      EXPECT_EQ(got, want) << "slot " << i << " temperature " << T;
      last = got;
    }
    int32_t hp = 0, hid = 0;
    b.gpu->download(&hp, pos_d, 4);
    b.gpu->download(&hid, ids_d, 4);
    EXPECT_EQ(hp, p0 + S * round);
    EXPECT_EQ(hid, last);
  }
  // the repetition penalty over a device history: each queued call reads the ids appended by the
  // ones before it (the host reference grows its history the same way)
  const int cap = 64;
  auto hist = b.gpu->alloc(cap * 4), hcnt = b.gpu->alloc(4);
  int32_t* hist_d = static_cast<int32_t*>(hist->data());
  int32_t* hcnt_d = static_cast<int32_t*>(hcnt->data());
  std::vector<int32_t> h = {3, 17, 99, 4096, 17};
  for (int i = 0; i < S; ++i) {  // the ids the plain sampler would pick go into the history: the penalty must move them
    int32_t best = -1;
    ASSERT_TRUE(b.gpu->sample(lg[size_t(i)]->act, SamplingParams{}, nullptr, 0, 0.f, &best));
    h.push_back(best);
  }
  const int32_t c0 = int32_t(h.size());
  b.gpu->upload(hist_d, h.data(), h.size() * 4);
  b.gpu->upload(hcnt_d, &c0, 4);
  SamplingParams pen;
  pen.repeat_penalty = 1e6f;
  for (int i = 0; i < S; ++i)
    ASSERT_TRUE(b.gpu->sample_to_device(lg[size_t(i)]->act, pen, 0.f, ids_d, pos_d, i, hist_d, hcnt_d, cap));
  for (int i = 0; i < S; ++i) {
    int32_t want = -1;
    ASSERT_TRUE(b.gpu->sample(lg[size_t(i)]->act, pen, h.data(), int(h.size()), 0.f, &want));
    EXPECT_EQ(b.gpu->sampled(i), want) << "penalty, slot " << i;
    EXPECT_NE(want, h[size_t(5 + i)]) << "the penalty moved the choice";
    h.push_back(want);
  }
  std::vector<int32_t> hd(h.size());
  int32_t cd = 0;
  b.gpu->download(&cd, hcnt_d, 4);
  b.gpu->download(hd.data(), hist_d, hd.size() * 4);
  EXPECT_EQ(cd, int32_t(h.size()));
  EXPECT_EQ(hd, h);
  EXPECT_THROW(b.gpu->sample_to_device(lg[0]->act, pen, 0.f, ids_d, pos_d, 0), Error);  // a penalty needs a history
  EXPECT_THROW(b.gpu->sample_to_device(lg[0]->act, SamplingParams{}, 0.f, ids_d, pos_d, S), Error);
}

}  // namespace
}  // namespace nf4flash::test
