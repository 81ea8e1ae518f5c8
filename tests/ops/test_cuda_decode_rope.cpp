// A decode layer's attention on CUDA (rope_kv_attention: rope + cache write in one kernel, then
// flash-decoding's split kernel and the wide combine) against the CPU f32 reference on fresh random
// inputs: GQA 8/2, 32/8, 14/2 (two head chunks, the second short), 16/1, 8/8; head_dim 64 and 128;
// bf16, f16 and f32; contexts from empty to 9000 positions (slices of the minimum 16 positions and
// up to 128 splits); the cache entry it writes; a captured decode step replayed as the position
// grows.
#include <cmath>

#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "ops/cuda_test_util.h"
#include "quant/blockwise.h"

namespace nf4flash::test {
namespace {

struct RopeAttnCase {
  int n_heads, n_kv, hd, pos0;
};

std::vector<float> inv_freqs(int hd) {
  std::vector<float> inv(size_t(hd / 2));
  for (int i = 0; i < hd / 2; ++i) inv[size_t(i)] = std::pow(500000.f, -2.f * i / hd);
  return inv;
}

// One backend with a 2-layer cache whose layer 1 holds random K/V at positions [0, pos0), and this
// step's unrotated q, k, v.
struct RopeSide {
  Backend& be;
  DevAct q, k, v, out, inv;
  DevInts pos;
  RopeSide(Backend& b, const RopeAttnCase& c, DType kv_dtype, const std::vector<float>& Kc, const std::vector<float>& Vc,
           const std::vector<float>& Q, const std::vector<float>& K, const std::vector<float>& V)
      : be(b), q(b, 1, int64_t(c.n_heads) * c.hd), k(b, 1, int64_t(c.n_kv) * c.hd), v(b, 1, int64_t(c.n_kv) * c.hd),
        out(b, 1, int64_t(c.n_heads) * c.hd), inv(b, 1, c.hd / 2, DType::F32), pos(b, {c.pos0}) {
    const int64_t kvw = int64_t(c.n_kv) * c.hd;
    b.kv_allocate({2, c.n_kv, c.hd, c.pos0 + 9, kv_dtype});
    if (c.pos0 > 0) {
      DevAct kc(b, c.pos0, kvw), vc(b, c.pos0, kvw);
      kc.set(Kc);
      vc.set(Vc);
      DevInts p0(b, {0});
      b.kv_write(1, kc.act, vc.act, StepState{p0.ptr()});
    }
    inv.set(inv_freqs(c.hd));
    reset(Q, K, V);
  }
  void reset(const std::vector<float>& Q, const std::vector<float>& K, const std::vector<float>& V) {
    q.set(Q);
    k.set(K);
    v.set(V);
  }
  RopeParams rope(int hd) const { return RopeParams{hd, static_cast<const float*>(inv.act.data)}; }
  std::vector<float> run(const RopeAttnCase& c) {
    out.poison();
    AttnParams p{c.n_heads, c.n_kv, c.hd, 1.f / std::sqrt(float(c.hd)), AttnImpl::Auto};
    be.rope_kv_attention(1, q.act, k.act, v.act, out.act, rope(c.hd), p, StepState{pos.ptr()});
    return out.get();
  }
};

void run_rope_attention(DType dt, const RopeAttnCase& c) {
  const int64_t kvw = int64_t(c.n_kv) * c.hd, qw = int64_t(c.n_heads) * c.hd;
  const auto Kc = rounded(randn(size_t(c.pos0 * kvw)), dt), Vc = rounded(randn(size_t(c.pos0 * kvw)), dt);
  const auto Q = rounded(randn(size_t(qw), 2.f), dt), K = rounded(randn(size_t(kvw)), dt), V = rounded(randn(size_t(kvw)), dt);
  const std::string what = cat(dtype_name(dt), " heads ", c.n_heads, "/", c.n_kv, " hd ", c.hd, " pos0 ", c.pos0);
  Backends b(dt);
  RopeSide cpu(*b.cpu, c, DType::F32, Kc, Vc, Q, K, V), gpu(*b.gpu, c, dt, Kc, Vc, Q, K, V);
  const auto ref = cpu.run(c);
  const auto got = gpu.run(c);
  EXPECT_LT(rel_err(got, ref), tol_for(dt)) << "rope + cache write + decode attention, " << what;
  // the cache entry it wrote, read back by the attention alone with q rotated apart: the same bits
  DevAct q2(*b.gpu, 1, qw), k2(*b.gpu, 1, kvw), o2(*b.gpu, 1, qw);
  q2.set(Q);
  k2.set(K);
  b.gpu->rope(q2.act, k2.act, gpu.rope(c.hd), StepState{gpu.pos.ptr()});
  o2.poison();
  AttnParams p{c.n_heads, c.n_kv, c.hd, 1.f / std::sqrt(float(c.hd)), AttnImpl::Auto};
  b.gpu->attention(1, q2.act, o2.act, p, StepState{gpu.pos.ptr()});
  EXPECT_EQ(o2.get(), got) << "attention over the written cache entry, " << what;
}

TEST(CudaOps, RopeAttentionDecode) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (RopeAttnCase c : {RopeAttnCase{8, 2, 128, 0}, RopeAttnCase{8, 2, 64, 50}, RopeAttnCase{32, 8, 128, 511},
                           RopeAttnCase{32, 8, 128, 512}, RopeAttnCase{32, 8, 128, 3000}, RopeAttnCase{14, 2, 64, 700},
                           RopeAttnCase{16, 1, 64, 257}, RopeAttnCase{8, 8, 64, 1000}, RopeAttnCase{32, 8, 128, 9000}})
      run_rope_attention(dt, c);
}

// A captured decode step (norm -> 4-bit q and k -> rope + attention -> add) replayed at growing
// positions gives what running it eagerly there gives.
TEST(CudaOps, RopeAttentionDecodeGraphReplay) {
  NF4FLASH_REQUIRE_CUDA();
  Backends b;
  auto& g = *b.gpu;
  const int64_t H = 256, hd = 64, nh = 4, nkv = 2, P = 700;
  g.kv_allocate({1, int(nkv), int(hd), P + 16, DType::BF16});
  {  // the existing context
    DevAct kc(g, P, nkv * hd), vc(g, P, nkv * hd);
    kc.set(rounded(randn(size_t(P * nkv * hd)), DType::BF16));
    vc.set(rounded(randn(size_t(P * nkv * hd)), DType::BF16));
    DevInts p0(g, {0});
    g.kv_write(0, kc.act, vc.act, StepState{p0.ptr()});
  }
  auto Wq = randn(size_t(nh * hd * H), 0.05f), Wk = randn(size_t(nkv * hd * H), 0.05f), Nw = randn(size_t(H));
  auto qq = std::make_shared<Quant4Tensor>(quantize_4bit(Wq.data(), DType::F32, nh * hd, H, QuantType::NF4, 64, true));
  auto qk = std::make_shared<Quant4Tensor>(quantize_4bit(Wk.data(), DType::F32, nkv * hd, H, QuantType::NF4, 64, true));
  auto wq = g.upload_quant4(qq), wk = g.upload_quant4(qk);
  auto nw = g.upload_dense(f32_tensor(Nw, {H}), DType::BF16);
  DevAct invd(g, 1, hd / 2, DType::F32), x(g, 1, H), xn(g, 1, H), q(g, 1, nh * hd), k(g, 1, nkv * hd), o(g, 1, nh * hd);
  invd.set(inv_freqs(int(hd)));
  DevInts pos(g, {0});
  StepState s{pos.ptr()};
  RopeParams rp{int(hd), static_cast<const float*>(invd.act.data)};
  AttnParams ap{int(nh), int(nkv), int(hd), 0.125f, AttnImpl::Auto};
  auto step = [&] {
    g.rms_norm(x.act, *nw, 1e-6f, xn.act);
    g.linear(xn.act, *wq, nullptr, q.act);
    g.linear(xn.act, *wk, nullptr, k.act);
    g.rope_kv_attention(0, q.act, k.act, k.act, o.act, rp, ap, s);
    g.add(o.act, x.act, o.act);
  };
  std::vector<std::vector<float>> xs, eager;
  for (int p = int(P); p < int(P) + 4; ++p) {
    g.upload(pos.ptr(), &p, 4);
    xs.push_back(rounded(randn(size_t(H)), DType::BF16));
    x.set(xs.back());
    step();
    eager.push_back(o.get());
  }
  int p = int(P);
  g.upload(pos.ptr(), &p, 4);
  x.set(xs[0]);
  g.capture_begin();
  step();
  const int id = g.capture_end();
  for (p = int(P); p < int(P) + 4; ++p) {
    g.upload(pos.ptr(), &p, 4);
    x.set(xs[size_t(p - P)]);
    g.replay(id);
    g.sync();
    EXPECT_EQ(o.get(), eager[size_t(p - P)]) << "graph replay of the decode attention at position " << p;
  }
}

}  // namespace
}  // namespace nf4flash::test
