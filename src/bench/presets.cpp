#include "bench/presets.h"

#include <cmath>
#include <map>
#include <mutex>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/arch.h"
#include "nf4flash/engine.h"
#include "runtime/engine_impl.h"

namespace nf4flash {

namespace {

struct PresetRow {
  const char* name;
  const char* arch;
  int64_t vocab, hidden, inter;
  int layers, heads, kv_heads, head_dim;
  int64_t max_pos;
  double theta;
  bool tied, qkv_bias;
  const char* rope_type;
  double rope_factor;
  int64_t rope_orig;
};

constexpr PresetRow kPresets[] = {
    {"llama3-8b", "LlamaForCausalLM", 128256, 4096, 14336, 32, 32, 8, 128, 131072, 500000.0, false, false, "llama3", 8.0, 8192},
    {"llama3.2-1b", "LlamaForCausalLM", 128256, 2048, 8192, 16, 32, 8, 64, 131072, 500000.0, true, false, "llama3", 32.0, 8192},
    {"qwen2.5-7b", "Qwen2ForCausalLM", 152064, 3584, 18944, 28, 28, 4, 128, 32768, 1000000.0, false, true, "default", 1.0, 0},
    {"mistral-7b", "MistralForCausalLM", 32000, 4096, 14336, 32, 32, 8, 128, 32768, 1000000.0, false, false, "default", 1.0, 0},
    {"llama3-70b", "LlamaForCausalLM", 128256, 8192, 28672, 80, 64, 8, 128, 131072, 500000.0, false, false, "llama3", 8.0, 8192},
    {"tiny", "LlamaForCausalLM", 1024, 256, 704, 3, 4, 2, 64, 4096, 10000.0, false, false, "default", 1.0, 0},
    // the other families (their extras in family_extras)
    {"gemma2-9b", "Gemma2ForCausalLM", 256000, 3584, 14336, 42, 16, 8, 256, 8192, 10000.0, true, false, "default", 1.0, 0},
    {"phi3-mini", "Phi3ForCausalLM", 32064, 3072, 8192, 32, 32, 32, 96, 4096, 10000.0, false, false, "default", 1.0, 0},
    {"mixtral-8x7b", "MixtralForCausalLM", 32000, 4096, 14336, 32, 32, 8, 128, 32768, 1000000.0, false, false, "default", 1.0, 0},
    {"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 151936, 2048, 6144, 48, 32, 4, 128, 40960, 1000000.0, false, false, "default", 1.0, 0},
};

// What the hub configs of these shapes add to the table's columns.
void family_extras(const std::string& name, ModelConfig& c) {
  if (name == "gemma2-9b") {
    c.hidden_act = "gelu_pytorch_tanh";
    c.query_pre_attn_scalar = 256;
    c.attn_softcap = 50;
    c.final_softcap = 30;
    c.rms_eps = 1e-6;
    c.sliding_window = 4096;
    c.sliding_layers.assign(size_t(c.n_layers), false);
    for (int i = 0; i < c.n_layers; i += 2) c.sliding_layers[size_t(i)] = true;
  } else if (name == "mixtral-8x7b") {
    c.moe.n_experts = 8;
    c.moe.top_k = 2;
    c.moe.expert_intermediate = c.intermediate_size;
    c.moe.norm_topk = true;
  } else if (name == "qwen3-30b-a3b") {
    c.moe.n_experts = 128;
    c.moe.top_k = 8;
    c.moe.expert_intermediate = 768;
    c.moe.norm_topk = true;
  }
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

class SyntheticStore final : public WeightStore {
 public:
  SyntheticStore(const ModelConfig& cfg, const std::string& name) : cfg_(cfg), arch_(resolve_arch(cfg)) {
    source_name_ = "preset " + name;
    source_ = source_name_;
  }

  const TensorInfo* find(const std::string& name) const override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = made_.find(name);
    if (it != made_.end()) return &it->second.info;
    std::vector<int64_t> shape;
    float center = 0, halfwidth = 0;
    if (!shape_of(name, &shape, &center, &halfwidth)) return nullptr;
    Entry& e = made_[name];
    e.info.name = name;
    e.info.dtype = DType::BF16;
    e.info.shape = shape;
    e.info.file = source_name_;
    const int64_t n = e.info.numel();
    e.data.resize(n);
    const uint64_t seed = hash_name(name);
    uint16_t* out = e.data.data();
    thread_pool().parallel_for(n, 1 << 16, [&](int64_t b, int64_t en) {
      for (int64_t i = b; i < en; ++i) {
        const uint64_t r = splitmix(seed ^ static_cast<uint64_t>(i) * 0xd1342543de82ef95ull);
        const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        out[i] = f32_to_bf16(center + (2.0f * u - 1.0f) * halfwidth);
      }
    });
    e.info.data = reinterpret_cast<const uint8_t*>(e.data.data());
    e.info.nbytes = static_cast<size_t>(n) * 2;
    return &e.info;
  }

  void release(const std::string& name) const override {
    std::lock_guard<std::mutex> lk(mu_);
    made_.erase(name);
  }

  std::vector<std::string> names() const override { return {}; }

 private:
  struct Entry {
    TensorInfo info;
    std::vector<uint16_t> data;
  };

  bool shape_of(const std::string& name, std::vector<int64_t>* shape, float* center, float* hw) const {
    const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, V = cfg_.vocab_size;
    const int64_t q = int64_t{cfg_.n_heads} * cfg_.head_dim, kv = int64_t{cfg_.n_kv_heads} * cfg_.head_dim;
    const float lin = 0.02f * std::sqrt(3.0f);
    auto set = [&](std::vector<int64_t> s, float c, float h) {
      *shape = std::move(s);
      *center = c;
      *hw = h;
      return true;
    };
    if (name == "model.embed_tokens.weight") return set({V, H}, 0, 1.0f);
    if (name == "lm_head.weight") return !cfg_.tie_embeddings && set({V, H}, 0, lin);
    if (name == "model.norm.weight") return set({H}, arch_.gemma ? 0.0f : 1.0f, 0.1f);
    const std::string pre = "model.layers.";
    if (name.rfind(pre, 0) != 0) return false;
    const size_t dot = name.find('.', pre.size());
    if (dot == std::string::npos) return false;
    const int layer = std::atoi(name.substr(pre.size(), dot - pre.size()).c_str());
    if (layer < 0 || layer >= cfg_.n_layers) return false;
    const std::string s = name.substr(dot + 1);
    const float norm = arch_.gemma ? 0.0f : 1.0f;  // Gemma's norms scale by (1 + w)
    if (s == "input_layernorm.weight" || s == "post_attention_layernorm.weight") return set({H}, norm, 0.1f);
    if (arch_.gemma && (s == "pre_feedforward_layernorm.weight" || s == "post_feedforward_layernorm.weight"))
      return set({H}, norm, 0.1f);
    if (arch_.fused_qkv && s == "self_attn.qkv_proj.weight") return set({q + 2 * kv, H}, 0, lin);
    if (arch_.fused_gate_up && s == "mlp.gate_up_proj.weight") return set({2 * I, H}, 0, lin);
    if (cfg_.moe.sparse(layer)) {
      const int64_t E = cfg_.moe.n_experts, Ie = cfg_.moe.expert_intermediate;
      const bool mixtral = arch_.moe == ArchFlags::Moe::Mixtral;
      const std::string base = mixtral ? "block_sparse_moe." : "mlp.";
      if (s == base + "gate.weight") return set({E, H}, 0, lin);
      if (s.rfind(base + "experts.", 0) == 0) {
        auto ends = [&](const std::string& x) { return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0; };
        if (ends(".w2.weight") || ends(".down_proj.weight")) return set({H, Ie}, 0, lin);
        return set({Ie, H}, 0, lin);
      }
    }
    if (s == "self_attn.q_proj.weight") return set({q, H}, 0, lin);
    if (s == "self_attn.k_proj.weight" || s == "self_attn.v_proj.weight") return set({kv, H}, 0, lin);
    if (s == "self_attn.o_proj.weight") return set({H, q}, 0, lin);
    if (s == "mlp.gate_proj.weight" || s == "mlp.up_proj.weight") return set({I, H}, 0, lin);
    if (s == "mlp.down_proj.weight") return set({H, I}, 0, lin);
    if (arch_.q_bias && s == "self_attn.q_proj.bias") return set({q}, 0, 0.05f);
    if (arch_.k_bias && s == "self_attn.k_proj.bias") return set({kv}, 0, 0.05f);
    if (arch_.v_bias && s == "self_attn.v_proj.bias") return set({kv}, 0, 0.05f);
    if (arch_.qk_norm && (s == "self_attn.q_norm.weight" || s == "self_attn.k_norm.weight"))
      return set({cfg_.head_dim}, arch_.gemma ? 0.0f : 1.0f, 0.1f);
    return false;
  }

  ModelConfig cfg_;
  ArchFlags arch_;
  std::string source_name_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Entry> made_;
};

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.emplace_back(p.name);
  return out;
}

std::string preset_list() {
  std::string list;
  for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
  return list;
}

ModelConfig preset_config(const std::string& name) {
  for (const auto& p : kPresets) {
    if (name != p.name) continue;
    ModelConfig c;
    c.architecture = p.arch;
    c.model_type = "preset";
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.inter;
    c.n_layers = p.layers;
    c.n_heads = p.heads;
    c.n_kv_heads = p.kv_heads;
    c.head_dim = p.head_dim;
    c.max_positions = p.max_pos;
    c.rms_eps = 1e-5;
    c.tie_embeddings = p.tied;
    c.rope.theta = p.theta;
    c.rope.type = p.rope_type;
    c.rope.factor = p.rope_factor;
    c.rope.original_max_positions = p.rope_orig;
    c.weights_dtype = DType::BF16;
    c.eos_ids = {2};
    c.source = std::string("preset ") + p.name;
    c.sliding_layers.assign(size_t(c.n_layers), false);
    family_extras(p.name, c);
    return c;
  }
  fail("--preset '", name, "' is unknown (known: ", preset_list(), ")");
}

std::unique_ptr<WeightStore> make_synthetic_store(const ModelConfig& cfg, const std::string& name) {
  return std::make_unique<SyntheticStore>(cfg, name);
}

std::unique_ptr<Engine> Engine::load_synthetic(const ModelConfig& cfg, const std::string& name, const LoadOptions& opts) {
  LoadOptions o = opts;
  o.load_tokenizer = false;
  return std::unique_ptr<Engine>(new Engine(build_engine(o, cfg, make_synthetic_store(cfg, name), "synthetic:" + name, nullptr)));
}

std::unique_ptr<Engine> Engine::load_preset(const std::string& preset, const LoadOptions& opts, const ProgressFn& progress) {
  ModelConfig cfg = preset_config(preset);
  LoadOptions o = opts;
  o.load_tokenizer = false;
  auto im = build_engine(o, cfg, make_synthetic_store(cfg, preset), "preset:" + preset, progress);
  if (!opts.tokenizer_dir.empty()) load_tokenizer_into(*im, opts.tokenizer_dir);
  return std::unique_ptr<Engine>(new Engine(std::move(im)));
}

}  // namespace nf4flash
