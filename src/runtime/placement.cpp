#include "runtime/placement.h"

#include <cctype>
#include <cmath>

#include "core/error.h"
#include "model/arch.h"

namespace nf4flash {

size_t parse_size(const std::string& flag, const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string num = text.substr(0, i), unit = text.substr(i);
  double v = -1;
  try {
    size_t used = 0;
    v = num.empty() ? -1 : std::stod(num, &used);
    if (used != num.size()) v = -1;
  } catch (...) {
    v = -1;
  }
  double scale = 0;
  std::string u;
  for (char c : unit) u += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u.empty() || u == "B") scale = 1;
  const char* prefixes = "KMGT";
  for (int p = 0; p < 4; ++p) {
    const std::string s(1, prefixes[p]);
    if (u == s || u == s + "I" || u == s + "IB") scale = std::pow(1024.0, p + 1);
    if (u == s + "B") scale = std::pow(1000.0, p + 1);
  }
  if (v < 0 || scale == 0 || !std::isfinite(v))
    fail(flag, " '", text, "': expected a size such as 10GiB, 12GB, 512MiB or a byte count");
  const double bytes = v * scale;
  if (bytes < 1 || bytes > 1e18) fail(flag, " '", text, "': out of range");
  return static_cast<size_t>(bytes);
}

int parse_gpu_layers(const std::string& text) {
  if (text == "all") return kAllLayers;
  if (text == "auto") return kAutoLayers;
  size_t used = 0;
  long v = -1;
  try {
    v = std::stol(text, &used);
  } catch (...) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < 0 || v > 100000)
    fail("--gpu-layers '", text, "': expected a layer count, auto or all");
  return static_cast<int>(v);
}

std::string gpu_layers_name(int g) {
  return g == kAllLayers ? "all" : g == kAutoLayers ? "auto" : std::to_string(g);
}

size_t quant4_bytes(size_t n, int blocksize, bool dq, size_t tensors) {
  const size_t blocks = (n + blocksize - 1) / blocksize, tables = tensors * (16 * 4 + (dq ? 256 * 4 : 0));
  if (!dq) return n / 2 + blocks * 4 + tables;
  // nested absmax rounded up per tensor: at most one more each than over the whole
  return n / 2 + blocks + ((blocks + 255) / 256 + tensors) * 4 + tables;
}

size_t ModelBytes::weights() const {
  size_t s = embed + head + final_norm;
  for (size_t b : layer) s += b;
  return s;
}

ModelBytes model_bytes(const ModelConfig& c, const Plan& p, const LoadOptions& o) {
  const size_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const size_t qd = size_t(c.n_heads) * c.head_dim, kvd = size_t(c.n_kv_heads) * c.head_dim;
  const DType store = p.device == Device::CPU ? (p.compute == DType::F32 ? DType::F32 : DType::BF16) : p.compute;
  const size_t es = dtype_size(store);
  const ArchFlags f = resolve_arch(c);
  const size_t norms = f.gemma ? 4 : 2;  // Gemma: post-attention and post-MLP too
  const bool q4 = p.quant != QuantType::None;
  ModelBytes m;
  for (int i = 0; i < c.n_layers; ++i) {
    // MLP weights: dense layers 3 H I; mixture-of-experts layers every expert's (4-bit like any
    // linear) plus a dense router (and Qwen2-MoE's shared expert and its gate)
    // (and the 4-bit tensors they are stored in, each with its code table)
    size_t mlp = 3 * H * I, mlp_read = mlp, router = 0, mlp_bias = f.mlp_bias ? 2 * I + H : 0;
    size_t mlp_tensors = f.fused_gate_up ? 2 : 3, mlp_read_tensors = mlp_tensors;
    if (c.moe.sparse(i)) {
      const size_t expert = 3 * H * c.moe.expert_intermediate, shared = 3 * H * c.moe.shared_intermediate;
      mlp = size_t(c.moe.n_experts) * expert + shared;
      mlp_read = size_t(c.moe.top_k) * expert + shared;
      router = size_t(c.moe.n_experts) * H + (c.moe.shared_intermediate ? H : 0);
      mlp_bias = 0;
      mlp_tensors = 3 * size_t(c.moe.n_experts) + (shared ? 3 : 0);
      mlp_read_tensors = 3 * size_t(c.moe.top_k) + (shared ? 3 : 0);
    }
    const size_t attn = H * qd + 2 * H * kvd + qd * H, attn_tensors = f.fused_qkv ? 2 : 4;
    // norms, the biases the architecture has, Qwen3's per-head q/k norms, the router
    const size_t vectors = norms * H + (f.q_bias ? qd : 0) + (f.k_bias ? kvd : 0) + (f.v_bias ? kvd : 0) +
                           (f.o_bias ? H : 0) + mlp_bias + (f.qk_norm ? 2 * size_t(c.head_dim) : 0) + router;
    auto bytes = [&](size_t linear, size_t tensors) {
      return (q4 ? quant4_bytes(linear, o.blocksize, p.double_quant, tensors) : linear * es) + vectors * es;
    };
    const size_t linear = attn + mlp;
    m.layer.push_back(bytes(linear, attn_tensors + mlp_tensors));
    m.layer_read.push_back(bytes(attn + mlp_read, attn_tensors + mlp_read_tensors));
    m.layer_params.push_back(linear + router);
  }
  m.embed = V * H * es;
  m.final_norm = H * es;
  m.head_params = V * H;
  m.head_quant4 = q4 && o.quant_lm_head && !c.tie_embeddings;
  if (!c.tie_embeddings) m.head = m.head_quant4 ? quant4_bytes(V * H, o.blocksize, p.double_quant, 1) : V * H * es;
  const size_t kv_elt = p.device == Device::CPU ? 4 : dtype_size(p.compute);
  m.kv_token_layer = 2 * kvd * kv_elt;
  m.kv_token_layer_host = 2 * kvd * 4;
  const size_t rows = static_cast<size_t>(resolve_ubatch(o.ubatch, p.device));
  m.workspace = rows * V * 4 + rows * (4 * H + 2 * qd + 2 * I) * dtype_size(p.device == Device::CPU ? DType::F32 : p.compute);
  return m;
}

Placement place_layers(const ModelBytes& m, int64_t ctx, int requested, size_t budget, const std::string& budget_text) {
  Placement pl;
  pl.n_layers = static_cast<int>(m.layer.size());
  pl.ctx = ctx;
  pl.budget = budget;
  pl.gpu_fixed = m.embed + m.head + m.final_norm + m.workspace + kGpuReserveBytes;
  if (requested > pl.n_layers)
    fail("--gpu-layers ", requested, ": the model has ", pl.n_layers, " layers");
  auto layer_gpu = [&](int i) { return m.layer[size_t(i)] + m.kv_token_layer * size_t(ctx); };
  // the most first layers the budget holds
  int fit = 0;
  size_t used = pl.gpu_fixed;
  while (fit < pl.n_layers && (budget == 0 || used + layer_gpu(fit) <= budget)) used += layer_gpu(fit++);
  const auto gib = [](size_t b) { return cat(std::round(b / double(1 << 30) * 100) / 100, " GiB"); };
  int n = requested == kAllLayers ? pl.n_layers : requested == kAutoLayers ? fit : requested;
  if (budget > 0 && (n > fit || (requested == kAutoLayers && fit == 0))) {
    const size_t need_one = pl.gpu_fixed + layer_gpu(0);
    if (fit == 0)
      fail(budget_text, " is below what one layer on the GPU needs: ", gib(need_one), " (embeddings, lm_head and workspace ",
           gib(pl.gpu_fixed), ", a layer with its KV cache at ctx ", ctx, " ", gib(layer_gpu(0)), ")");
    fail(budget_text, " holds ", fit, " of the ", pl.n_layers, " layers at ctx ", ctx, ", not ",
           requested == kAllLayers ? cat("all ", pl.n_layers) : std::to_string(n),
           ": use --gpu-layers auto (or ", fit, "), a smaller --ctx-size, or --quant nf4");
  }
  pl.gpu_layers = n;
  for (int i = 0; i < pl.n_layers; ++i) {
    if (i < n) {
      pl.gpu_weights += m.layer[size_t(i)];
      pl.gpu_kv += m.kv_token_layer * size_t(ctx);
    } else {
      pl.cpu_weights += m.layer[size_t(i)];
      pl.cpu_kv += m.kv_token_layer_host * size_t(ctx);
    }
  }
  return pl;
}

}  // namespace nf4flash
