// The mixture-of-experts MLP of Mixtral, Qwen2-MoE and Qwen3-MoE:
//
//   p = softmax(x R^T) in f32; the top_k experts of each row (renormalized with norm_topk);
//   out[t] = sum over the row's experts e, in ascending e: p_e * down_e(silu(gate_e x) * up_e x)
//            (+ sigmoid(x g_s^T) * shared(x) for Qwen2-MoE's shared expert)
//
// as transformers computes it (experts visited in index order, each adding its weighted output).
// Two ways, by backend:
//  - on the device (CUDA: the backend's expert set, Backend::moe_experts): the router's logits,
//    routing, the selected experts and the weighted sum all stay in backend memory, with no host
//    sync (a decode step is captured in a CUDA graph); the shared expert through the usual linears.
//  - routed on the host (the CPU backend): each expert multiplies only the rows routed to it,
//    gathered into a contiguous block; the experts' products run as one group
//    (Backend::linear_group).
// Either way a 4-bit decode step reads only the selected experts. A row's result does not depend on
// the other rows of the step, so batching does not change it.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "io/hf_config.h"

namespace nf4flash {

struct ExpertWeights {
  std::unique_ptr<Weight> gate, up, down;
};

struct MoeWeights {
  std::unique_ptr<Weight> router;  // [n_experts, hidden], dense
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;                 // Qwen2-MoE, else empty
  std::unique_ptr<Weight> shared_gate;  // [1, hidden]
  std::unique_ptr<Backend::ExpertSet> set;  // the backend's bundle of `experts`, or null (host routing)
};

class MoeBlock {
 public:
  MoeBlock(Backend& be, const ModelConfig& cfg) : be_(be), cfg_(cfg) {}
  // out [T, hidden] = the block applied to x [T, hidden] (the normed hidden states); residual:
  // out += it (rounded to the compute dtype first, as add() adds)
  void forward(Act x, const MoeWeights& w, Act out, bool residual = false);

 private:
  // buffers for `rows` rows: routed on the device (the shared expert's and the logits only) or on the host
  void ensure(int64_t rows, bool device);
  void forward_host(Act x, const MoeWeights& w, Act out, bool residual);
  void forward_device(Act x, const MoeWeights& w, Act out, bool residual);
  // xs through one expert's SwiGLU into ys (the shared expert)
  void expert(const ExpertWeights& e, int64_t inter, Act xs, Act ys);

  Backend& be_;
  const ModelConfig& cfg_;
  int64_t cap_ = 0;
  std::unique_ptr<Buffer> logits_, xs_, g_, u_, ys_, shared_logit_, scratch_;
  std::vector<float> h_logits_, h_x_, h_y_, h_out_;
};

}  // namespace nf4flash
