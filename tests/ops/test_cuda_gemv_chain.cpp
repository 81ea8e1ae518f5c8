// linear_chain on the CUDA backend: a decode layer's dependent GEMVs (o + residual, norm + gate/up +
// SiLU, down + residual, the next layer's norm + q/k/v) in one persistent launch of the lean
// kernel (opt-in: NF4FLASH_GEMV_CHAIN=1), against the same stages one launch each (the default)
// bit for bit and against
// the CPU backend's ops. Shapes: stages with fewer row tiles than blocks (blocks that sit a stage
// out), K and V of row counts that are not multiples of 16, 1 and 3 tokens, NF4 double quant and
// FP4 plain absmax, bias, bf16 and f16; eager twice and graph replays (the stage counters reset
// themselves). Stages the chain cannot take (K not a multiple of 2048) run one by one, same results.
#include "core/error.h"
#include "nf4flash/engine.h"
#include "ops/cuda_test_util.h"

#include <cstdlib>

namespace nf4flash::test {
namespace {

struct ChainCase {
  DType dt;
  QuantType type;
  bool dq;
  int64_t H, I, KV, T;
  bool one_launch;  // whether the chain takes the stages (H and I multiples of 2048)
};

// One backend's buffers and the chain's stages over them.
struct Side {
  std::unique_ptr<DevAct> x, att, xn, tmp, g, u, q, k, v;
  Backend::ChainStage st[4];
  Side(Backend& be, const ChainCase& c, bool cpu, const QW& o, const QW& gt, const QW& up, const QW& dn, const QW& wq,
       const QW& wk, const QW& wv, const Weight& n1, const Weight& n2) {
    const int64_t T = c.T;
    x = std::make_unique<DevAct>(be, T, c.H);
    att = std::make_unique<DevAct>(be, T, c.H);
    xn = std::make_unique<DevAct>(be, T, c.H);
    tmp = std::make_unique<DevAct>(be, T, c.H);
    g = std::make_unique<DevAct>(be, T, c.I);
    u = std::make_unique<DevAct>(be, T, c.I);
    q = std::make_unique<DevAct>(be, T, c.H);
    k = std::make_unique<DevAct>(be, T, c.KV);
    v = std::make_unique<DevAct>(be, T, c.KV);
    auto W = [&](const QW& w) { return cpu ? w.cpu.get() : w.gpu.get(); };
    auto B = [&](const QW& w) { return cpu ? w.bcpu.get() : w.bgpu.get(); };
    using Stage = Backend::ChainStage;
    const Backend::LinearOut qkv[3] = {{W(wq), B(wq), q->act}, {W(wk), B(wk), k->act}, {W(wv), B(wv), v->act}};
    st[0] = Stage::residual(att->act, {W(o), B(o), tmp->act}, x->act);
    st[1] = Stage::norm_swiglu(x->act, n1, 1e-5f, xn->act, {W(gt), B(gt), g->act}, {W(up), B(up), u->act});
    st[2] = Stage::residual(u->act, {W(dn), B(dn), tmp->act}, x->act);
    st[3] = Stage::norm_multi(x->act, n2, 1e-5f, xn->act, qkv, 3);
  }
  void set(const std::vector<float>& X, const std::vector<float>& ATT) {
    x->set(X);
    att->set(ATT);
    for (auto* d : {u.get(), q.get(), k.get(), v.get()}) d->poison();
  }
  std::vector<std::vector<float>> outputs() const { return {x->get(), u->get(), q->get(), k->get(), v->get()}; }
};

void run_chain(const ChainCase& c) {
  SCOPED_TRACE(cat(dtype_name(c.dt), c.type == QuantType::NF4 ? " nf4" : " fp4", c.dq ? "-dq" : "", " H=", c.H,
                   " I=", c.I, " KV=", c.KV, " T=", c.T));
  Backends b(c.dt);
  QW o = make_q4(b, c.dt, c.type, c.dq, c.H, c.H, true), gt = make_q4(b, c.dt, c.type, c.dq, c.I, c.H, false),
     up = make_q4(b, c.dt, c.type, c.dq, c.I, c.H, true), dn = make_q4(b, c.dt, c.type, c.dq, c.H, c.I, false),
     wq = make_q4(b, c.dt, c.type, c.dq, c.H, c.H, true), wk = make_q4(b, c.dt, c.type, c.dq, c.KV, c.H, false),
     wv = make_q4(b, c.dt, c.type, c.dq, c.KV, c.H, true);
  const auto N1 = randn(size_t(c.H), 1.f), N2 = randn(size_t(c.H), 1.f);
  auto n1c = b.cpu->upload_dense(f32_tensor(N1, {c.H}), DType::F32), n2c = b.cpu->upload_dense(f32_tensor(N2, {c.H}), DType::F32);
  auto n1g = b.gpu->upload_dense(f32_tensor(N1, {c.H}), c.dt), n2g = b.gpu->upload_dense(f32_tensor(N2, {c.H}), c.dt);
  Side cs(*b.cpu, c, true, o, gt, up, dn, wq, wk, wv, *n1c, *n2c), gs(*b.gpu, c, false, o, gt, up, dn, wq, wk, wv, *n1g, *n2g);
  const auto X = rounded(randn(size_t(c.T * c.H), 2.f), c.dt), ATT = rounded(randn(size_t(c.T * c.H)), c.dt);

  cs.set(X, ATT);
  b.cpu->linear_chain(cs.st, 4);
  const auto ref = cs.outputs();
  EXPECT_FALSE(b.gpu->chain_is_one_launch(gs.st, 4));  // the default: one launch per stage
  gs.set(X, ATT);
  b.gpu->linear_chain(gs.st, 4);
  const auto sep = gs.outputs();
  setenv("NF4FLASH_GEMV_CHAIN", "1", 1);
  EXPECT_EQ(b.gpu->chain_is_one_launch(gs.st, 4), c.one_launch);
  EXPECT_EQ(b.gpu->chain_is_one_launch(gs.st, 3), c.one_launch);
  const char* names[] = {"x (residual)", "silu(gate) * up", "q", "k", "v"};
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_LT(rel_err(sep[i], ref[i]), 1.5e-2) << names[i];
  for (int rep = 0; rep < 2; ++rep) {
    gs.set(X, ATT);
    b.gpu->linear_chain(gs.st, 4);
    const auto got = gs.outputs();
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(got[i], sep[i]) << names[i] << ", eager run " << rep;
  }
  // three stages (the last layer's chain) and graph replays
  gs.set(X, ATT);
  b.gpu->capture_begin();
  b.gpu->linear_chain(gs.st, 3);
  b.gpu->linear_chain(gs.st + 3, 1);
  const int id = b.gpu->capture_end();
  for (int rep = 0; rep < 3; ++rep) {
    gs.set(X, ATT);
    b.gpu->replay(id);
    b.gpu->sync();
    const auto got = gs.outputs();
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(got[i], sep[i]) << names[i] << ", replay " << rep;
  }
  unsetenv("NF4FLASH_GEMV_CHAIN");
}

TEST(CudaGemvChain, MatchesStagesOneByOne) {
  NF4FLASH_REQUIRE_CUDA();
  run_chain({DType::BF16, QuantType::NF4, true, 2048, 6144, 136, 1, true});
  run_chain({DType::BF16, QuantType::NF4, true, 2048, 4096, 264, 3, true});
  run_chain({DType::F16, QuantType::FP4, false, 2048, 6144, 72, 2, true});
  run_chain({DType::BF16, QuantType::NF4, true, 1024, 2560, 136, 1, false});  // KT 16 / 40: one by one
}

// The chain serves the default configuration only: another lean configuration runs the stages one
// launch each also with NF4FLASH_GEMV_CHAIN=1 (same results, checked as above).
TEST(CudaGemvChain, OtherConfigurationRunsStagesOneByOne) {
  NF4FLASH_REQUIRE_CUDA();
  setenv("NF4FLASH_GEMV_SEQ_CFG", "p8u4d3", 1);
  run_chain({DType::BF16, QuantType::NF4, true, 2048, 4096, 136, 1, false});
  unsetenv("NF4FLASH_GEMV_SEQ_CFG");
}

// The decoder's chains end to end: the llama3.2-1b preset (synthetic weights, hidden 2048,
// intermediate 8192: every chain qualifies) in NF4 double quant generates the same greedy tokens
// with the chains (NF4FLASH_GEMV_CHAIN=1) as with one launch per GEMV, and with graphs as without.
TEST(CudaGemvChain, DecoderGreedyTokensUnchanged) {
  NF4FLASH_REQUIRE_CUDA();
  LoadOptions o;
  o.device = DeviceChoice::CUDA;
  o.quant = QuantChoice::NF4;
  o.double_quant = true;
  o.ctx_size = 256;
  o.load_tokenizer = false;
  GenerateOptions go;
  go.max_new_tokens = 24;
  go.ignore_eos = true;
  go.reuse_cache = false;  // each generate prefills the prompt afresh
  const std::vector<int32_t> prompt = {128000, 791, 6864, 315, 9822, 374, 12366, 13};
  o.graphs = false;
  setenv("NF4FLASH_GEMV_CHAIN", "1", 1);
  auto eager = Engine::load_preset("llama3.2-1b", o);
  EXPECT_NE(eager->report().linear_decode.find("in one launch"), std::string::npos) << eager->report().linear_decode;
  const auto chained = eager->generate(prompt, go).tokens;
  o.graphs = true;
  auto graphed = Engine::load_preset("llama3.2-1b", o);
  EXPECT_EQ(graphed->generate(prompt, go).tokens, chained);
  unsetenv("NF4FLASH_GEMV_CHAIN");
  const auto separate = eager->generate(prompt, go).tokens;
  EXPECT_EQ(chained, separate);
}

}  // namespace
}  // namespace nf4flash::test
