// CudaBackend's mixture of experts: a layer's experts as one device table per matrix (gate, up,
// down: CudaExpertSet), and moe_experts(): routing, the experts' SwiGLU and down products over the
// routed rows grouped by expert, and the weighted sum, all queued on the stream with no host sync
// (kernels/moe.cuh), so a decode step with experts is captured in a CUDA graph like any other.
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/moe_launchers.h"

namespace nf4flash::cuda_impl {

namespace {

struct ExpertMat {
  MoeMatArgs args;
  MoeKind kind = MoeKind::Dense;
  std::unique_ptr<CudaBuffer> table;  // MoeExpertW [E]
};

class CudaExpertSet : public Backend::ExpertSet {
 public:
  ExpertMat gate, up, down;
  int n_experts = 0;
};

const CudaExpertSet& expert_set(const Backend::ExpertSet& s) {
  auto* c = dynamic_cast<const CudaExpertSet*>(&s);
  NF4FLASH_CHECK(c, "moe_experts: the expert set was not made by a CUDA backend");
  return *c;
}

}  // namespace

std::unique_ptr<Backend::ExpertSet> CudaBackend::make_expert_set(const std::vector<ExpertRefs>& experts) {
  const int E = int(experts.size());
  if (E == 0 || E > kMoeMaxExperts)
    fail("mixture of experts: ", E, " experts; the CUDA backend runs 1 to ", kMoeMaxExperts);
  auto set = std::make_unique<CudaExpertSet>();
  set->n_experts = E;
  // One matrix of every expert into a device table; all of them of one shape and format (4-bit
  // with the same code tables and block sizes, or dense in the compute dtype).
  auto make = [&](const Weight* ExpertRefs::*which, const char* what, ExpertMat& m) {
    std::vector<MoeExpertW> table;
    const Weight& w0 = *(experts[0].*which);
    const CudaQ4* q0 = tiled_q4(w0);
    for (int e = 0; e < E; ++e) {
      const Weight& w = *(experts[size_t(e)].*which);
      NF4FLASH_CHECK(w.rows() == w0.rows() && w.cols() == w0.cols(), "mixture of experts: expert ", e, "'s ", what,
                     " is [", w.rows(), ", ", w.cols(), "], expert 0's [", w0.rows(), ", ", w0.cols(), "]");
      const CudaQ4* q = tiled_q4(w);
      if (bool(q) != bool(q0) || (q && !same_q4_params(*q, *q0)))
        fail("mixture of experts: expert ", e, "'s ", what, " is stored unlike expert 0's (4-bit parameters differ)");
      MoeExpertW x;
      if (q) {
        x.w = q->dev.tiles;
        x.absmax = q->dev.double_quant ? static_cast<const void*>(q->dev.absq_tiled)
                                       : static_cast<const void*>(q->dev.absmax_tiled);
        x.nested_absmax = q->dev.nested_absmax;
        x.offset = q->dev.offset;
      } else {
        const auto* qf = dynamic_cast<const CudaQ4*>(&w);
        const CudaDense& d = as_dense(qf ? *qf->fallback : w, what);
        NF4FLASH_CHECK(d.dtype() == act_ && !d.on_host, "mixture of experts: expert ", e, "'s ", what, " is ",
                       dtype_name(d.dtype()), ", the compute dtype is ", dtype_name(act_));
        x.w = d.data->data();
      }
      table.push_back(x);
    }
    MoeMatArgs& a = m.args;
    a.rows = w0.rows();
    a.cols = w0.cols();
    a.RT = (a.rows + 15) / 16;
    a.KT = (a.cols + 63) / 64;
    if (q0) {
      std::copy(q0->dev.code, q0->dev.code + 16, a.code);
      a.nested_code = q0->dev.nested_code;
      a.log2_blocksize = q0->dev.log2_blocksize;
      a.log2_nested = q0->dev.log2_nested;
      m.kind = q0->dev.double_quant ? MoeKind::Q4DoubleQuant : MoeKind::Q4;
    }
    m.table = std::make_unique<CudaBuffer>(table.size() * sizeof(MoeExpertW));
    upload(m.table->data(), table.data(), m.table->bytes());
    a.experts = static_cast<const MoeExpertW*>(m.table->data());
  };
  make(&ExpertRefs::gate, "gate", set->gate);
  make(&ExpertRefs::up, "up", set->up);
  make(&ExpertRefs::down, "down", set->down);
  const MoeMatArgs &g = set->gate.args, &u = set->up.args, &d = set->down.args;
  NF4FLASH_CHECK(g.rows == u.rows && g.cols == u.cols && d.cols == g.rows && d.rows == g.cols,
                 "mixture of experts: gate [", g.rows, ", ", g.cols, "], up [", u.rows, ", ", u.cols, "] and down [",
                 d.rows, ", ", d.cols, "] do not chain");
  NF4FLASH_CHECK(set->gate.kind == set->up.kind && (set->gate.kind == MoeKind::Dense ||
                                                    std::equal(g.code, g.code + 16, u.code)),
                 "mixture of experts: the experts' gate and up are stored differently");
  return set;
}

size_t CudaBackend::moe_scratch_bytes(const ExpertSet& s, int64_t rows, int top_k) const {
  const CudaExpertSet& set = expert_set(s);
  return moe_scratch(rows, top_k, set.n_experts, set.gate.args.rows, set.down.args.rows, dtype_size(act_)).bytes;
}

void CudaBackend::moe_experts(Act x, Act logits, const ExpertSet& s, int top_k, bool norm_topk, Act shared,
                              Act shared_logit, void* scratch, Act out, bool residual) {
  const CudaExpertSet& set = expert_set(s);
  const int64_t T = x.rows, H = set.down.args.rows, I = set.gate.args.rows;
  const int E = set.n_experts, K = top_k;
  check_act(x, "moe_experts");
  check_act(out, "moe_experts");
  NF4FLASH_CHECK(x.cols == set.gate.args.cols && out.rows == T && out.cols == H, "moe_experts: x [", x.rows, ", ",
                 x.cols, "] and out [", out.rows, ", ", out.cols, "] for experts of hidden size ", H);
  NF4FLASH_CHECK(logits.dtype == DType::F32 && logits.rows == T && logits.cols == E,
                 "moe_experts: logits must be f32 [", T, ", ", E, "]");
  NF4FLASH_CHECK(K >= 1 && K <= E && K <= kMoeMaxTopK, "moe_experts: ", K, " experts per token of ", E,
                 " (the CUDA backend routes to at most ", kMoeMaxTopK, ")");
  if (shared.data) {
    check_act(shared, "moe_experts (shared expert)");
    NF4FLASH_CHECK(shared.rows == T && shared.cols == H && shared_logit.dtype == DType::F32 &&
                       shared_logit.rows == T && shared_logit.cols == 1,
                   "moe_experts: the shared expert's output must be [", T, ", ", H, "] with f32 logits [", T, ", 1]");
  }
  if (T == 0) return;
  const MoeScratch L = moe_scratch(T, K, E, I, H, dtype_size(act_));
  char* base = static_cast<char*>(scratch);
  auto at = [&](size_t off) { return base + off; };
  MoeRouteArgs r;
  r.logits = static_cast<const float*>(logits.data);
  r.T = int(T);
  r.E = E;
  r.K = K;
  r.norm = norm_topk ? 1 : 0;
  r.ids = reinterpret_cast<int32_t*>(at(L.ids));
  r.wts = reinterpret_cast<float*>(at(L.wts));
  r.pos_of = reinterpret_cast<int32_t*>(at(L.pos_of));
  r.row_of = reinterpret_cast<int32_t*>(at(L.row_of));
  r.chunks = reinterpret_cast<int32_t*>(at(L.chunks));
  r.n_chunks = reinterpret_cast<int32_t*>(at(L.n_chunks));
  // a decode step of up to 128 experts routes in the gate/up launch (ids and wts for down+combine)
  const bool fold = moe_route_folds(T, set.gate.kind, set.down.kind, act_, set.gate.args.cols, K, E);
  if (!fold) moe_route(r, stream_);

  const int64_t max_chunks = moe_max_chunks(T, K, E);
  const int max_pairs = T == 1 ? 1 : kMoeChunk;  // one row picks each expert once
  MoeGemvArgs gu;
  gu.m[0] = set.gate.args;
  gu.m[1] = set.up.args;
  gu.x = x.data;
  gu.row_of = r.row_of;
  gu.chunks = r.chunks;
  gu.n_chunks = r.n_chunks;
  gu.out = at(L.h);
  if (fold) {
    gu.logits = r.logits;
    gu.E = E;
    gu.norm = r.norm;
    gu.ids = r.ids;
    gu.wts = r.wts;
  }
  moe_gemv(gu, set.gate.kind, true, max_chunks, max_pairs, act_, stream_);
  MoeCombineArgs c;
  c.y = at(L.y);
  c.wts = r.wts;
  c.pos_of = r.pos_of;
  c.shared = shared.data;
  c.shared_logit = static_cast<const float*>(shared_logit.data);
  c.out = out.data;
  c.cols = H;
  c.T = int(T);
  c.K = K;
  c.residual = residual ? 1 : 0;
  if (fold || (T == 1 && moe_down_combine_applies(set.down.kind, act_, K))) {
    // a decode step: the down products and the weighted sum in one launch
    MoeDownCombineArgs dc;
    dc.m = set.down.args;
    dc.x = at(L.h);
    dc.ids = r.ids;
    dc.sum = c;
    return moe_down_combine(dc, set.down.kind, act_, stream_);
  }
  MoeGemvArgs dn;
  dn.m[0] = set.down.args;
  dn.x = at(L.h);
  dn.chunks = r.chunks;
  dn.n_chunks = r.n_chunks;
  dn.out = at(L.y);
  moe_gemv(dn, set.down.kind, false, max_chunks, max_pairs, act_, stream_);
  moe_combine(c, act_, stream_);
}

}  // namespace nf4flash::cuda_impl
