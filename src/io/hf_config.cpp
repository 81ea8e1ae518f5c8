#include "io/hf_config.h"

#include <cmath>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace nf4flash {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open");
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
}

template <typename T>
T get_or(const json& j, const char* key, T def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  try {
    return j[key].get<T>();
  } catch (const std::exception&) {
    fail(src, ": field ", key, " has the wrong type (", j[key].dump(), ")");
  }
}

std::vector<int32_t> id_list(const json& v) {
  std::vector<int32_t> out;
  if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  else if (v.is_array())
    for (const auto& e : v)
      if (e.is_number_integer()) out.push_back(e.get<int32_t>());
  return out;
}

}  // namespace

static ModelConfig parse_model_config_impl(const json& j, const std::string& src) {
  ModelConfig c;
  c.source = src;
  if (!j.is_object()) fail(src, ": not a JSON object");
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    if (!j["architectures"][0].is_string()) fail(src, ": architectures[0] is not a string (", j["architectures"][0].dump(), ")");
    c.architecture = j["architectures"][0].get<std::string>();
  }
  c.model_type = get_or<std::string>(j, "model_type", "", src);
  if (j.contains("text_config") && !j.contains("hidden_size"))
    fail(src, ": multimodal configs (text_config) are not supported; architecture ", c.architecture);
  c.vocab_size = get_or<int64_t>(j, "vocab_size", 0, src);
  c.hidden_size = get_or<int64_t>(j, "hidden_size", 0, src);
  c.intermediate_size = get_or<int64_t>(j, "intermediate_size", 0, src);
  c.n_layers = get_or<int>(j, "num_hidden_layers", 0, src);
  c.n_heads = get_or<int>(j, "num_attention_heads", 0, src);
  c.n_kv_heads = get_or<int>(j, "num_key_value_heads", c.n_heads, src);
  c.max_positions = get_or<int64_t>(j, "max_position_embeddings", 4096, src);
  c.rms_eps = get_or<double>(j, "rms_norm_eps", 1e-6, src);
  c.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", false, src);
  c.attention_bias = get_or<bool>(j, "attention_bias", false, src);
  c.mlp_bias = get_or<bool>(j, "mlp_bias", false, src);
  c.hidden_act = get_or<std::string>(j, "hidden_act", get_or<std::string>(j, "hidden_activation", "silu", src), src);
  auto num_or_zero = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0; };
  c.query_pre_attn_scalar = num_or_zero("query_pre_attn_scalar");
  c.attn_softcap = num_or_zero("attn_logit_softcapping");
  c.final_softcap = num_or_zero("final_logit_softcapping");
  for (const auto& [k, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
           {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.n_layers},
           {"num_attention_heads", c.n_heads}, {"num_key_value_heads", c.n_kv_heads}})
    if (v <= 0) fail(src, ": ", k, " must be a positive integer");
  if (c.n_heads % c.n_kv_heads != 0)
    fail(src, ": num_attention_heads ", c.n_heads, " is not a multiple of num_key_value_heads ", c.n_kv_heads);
  c.head_dim = get_or<int>(j, "head_dim", 0, src);
  if (c.head_dim <= 0) {
    if (c.hidden_size % c.n_heads != 0) fail(src, ": hidden_size not divisible by num_attention_heads and no head_dim");
    c.head_dim = static_cast<int>(c.hidden_size / c.n_heads);
  }
  if (c.head_dim % 2 != 0) fail(src, ": head_dim ", c.head_dim, " must be even for rotary embeddings");

  // RoPE: transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; the hub writes
  // rope_theta at top level and rope_scaling {rope_type|type, factor, ...} or null.
  const json* rp = nullptr;
  const json* rp_local = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("full_attention")) {
    rp = &j["rope_parameters"]["full_attention"];  // per layer type (Gemma 3): the sliding layers' below
    if (j["rope_parameters"].contains("sliding_attention")) rp_local = &j["rope_parameters"]["sliding_attention"];
  } else if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rp = &j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rp = &j["rope_scaling"];
  c.rope.theta = get_or<double>(j, "rope_theta", 10000.0, src);
  if (rp) {
    c.rope.theta = get_or<double>(*rp, "rope_theta", c.rope.theta, src);
    std::string type = get_or<std::string>(*rp, "rope_type", get_or<std::string>(*rp, "type", "default", src), src);
    c.rope.type = type;
    c.rope.factor = get_or<double>(*rp, "factor", 1.0, src);
    c.rope.low_freq_factor = get_or<double>(*rp, "low_freq_factor", 1.0, src);
    c.rope.high_freq_factor = get_or<double>(*rp, "high_freq_factor", 4.0, src);
    c.rope.original_max_positions = get_or<int64_t>(
        *rp, "original_max_position_embeddings", get_or<int64_t>(j, "original_max_position_embeddings", 0, src), src);
    if (type != "default" && type != "llama3" && type != "linear" && type != "longrope" && type != "yarn" &&
        type != "dynamic")
      fail(src, ": rope type '", type, "' is not supported (supported: default, llama3, linear, longrope, yarn, dynamic)");
    if (type == "dynamic") c.rope.dynamic_max_positions = c.max_positions;
    if (type == "yarn") {
      // transformers 5: attention_factor = mscale(factor, mscale) / mscale(factor, mscale_all_dim)
      // with both given, else 0.1 ln(factor) + 1 (the configured factor, checked on the goldens)
      if (c.rope.original_max_positions <= 0) c.rope.original_max_positions = c.max_positions;
      auto mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
      const double ms = get_or<double>(*rp, "mscale", 0.0, src), ms_all = get_or<double>(*rp, "mscale_all_dim", 0.0, src);
      if (rp->contains("attention_factor") && (*rp)["attention_factor"].is_number())
        c.rope.attention_factor = (*rp)["attention_factor"].get<double>();
      else if (ms != 0.0 && ms_all != 0.0)
        c.rope.attention_factor = mscale(c.rope.factor, ms) / mscale(c.rope.factor, ms_all);
      else
        c.rope.attention_factor = mscale(c.rope.factor, 1.0);
      c.rope.beta_fast = get_or<double>(*rp, "beta_fast", 32.0, src);
      c.rope.beta_slow = get_or<double>(*rp, "beta_slow", 1.0, src);
      c.rope.truncate = get_or<bool>(*rp, "truncate", true, src);
    }
    if (get_or<double>(*rp, "partial_rotary_factor", get_or<double>(j, "partial_rotary_factor", 1.0, src), src) != 1.0)
      fail(src, ": partial_rotary_factor other than 1 is not supported");
    if (type == "longrope") {
      const int half = c.head_dim / 2;
      for (const char* key : {"short_factor", "long_factor"}) {
        if (!rp->contains(key) || !(*rp)[key].is_array() || int((*rp)[key].size()) != half)
          fail(src, ": longrope needs ", key, " with head_dim / 2 = ", half, " numbers");
        auto& dst = std::string(key) == "short_factor" ? c.rope.short_factor : c.rope.long_factor;
        for (const auto& v : (*rp)[key]) {
          if (!v.is_number() || v.get<double>() <= 0) fail(src, ": longrope ", key, " must hold positive numbers");
          dst.push_back(v.get<double>());
        }
      }
      if (c.rope.original_max_positions <= 0) fail(src, ": longrope rope scaling needs original_max_position_embeddings");
      // transformers: factor = max_position_embeddings / original when the config gives the
      // original length, attention_factor = sqrt(1 + ln(factor) / ln(original)) unless given
      const double factor = double(c.max_positions) / double(c.rope.original_max_positions);
      c.rope.factor = factor;
      c.rope.attention_factor = rp->contains("attention_factor") && (*rp)["attention_factor"].is_number()
                                    ? (*rp)["attention_factor"].get<double>()
                                    : factor <= 1.0 ? 1.0
                                                    : std::sqrt(1.0 + std::log(factor) / std::log(double(c.rope.original_max_positions)));
    }
    if (type == "llama3" && c.rope.original_max_positions <= 0)
      fail(src, ": llama3 rope scaling needs original_max_position_embeddings");
    if (type != "default" && c.rope.factor <= 0) fail(src, ": rope factor must be positive");
  }

  if (rp_local || j.contains("rope_local_base_freq")) {
    c.has_local_rope = true;
    c.local_rope.theta = rp_local ? get_or<double>(*rp_local, "rope_theta", 10000.0, src)
                                  : get_or<double>(j, "rope_local_base_freq", 10000.0, src);
    if (rp_local && get_or<std::string>(*rp_local, "rope_type", "default", src) != "default")
      fail(src, ": the sliding layers' rope type must be default");
  }

  // MoE: the expert count is num_local_experts (Mixtral, and what transformers 5 writes for
  // Qwen3-MoE) or num_experts; an expert's width moe_intermediate_size where given (Qwen), else
  // intermediate_size (Mixtral, whose top-k weights are always renormalized)
  if (j.contains("num_local_experts") || j.contains("num_experts")) {
    MoeConfig& m = c.moe;
    const bool mixtral = c.architecture == "MixtralForCausalLM";
    m.n_experts = get_or<int>(j, j.contains("num_local_experts") ? "num_local_experts" : "num_experts", 0, src);
    m.top_k = get_or<int>(j, "num_experts_per_tok", 0, src);
    m.expert_intermediate = get_or<int64_t>(j, "moe_intermediate_size", c.intermediate_size, src);
    m.shared_intermediate = get_or<int64_t>(j, "shared_expert_intermediate_size", 0, src);
    m.norm_topk = mixtral || get_or<bool>(j, "norm_topk_prob", false, src);
    m.sparse_step = get_or<int>(j, "decoder_sparse_step", 1, src);
    if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array())
      for (const auto& v : j["mlp_only_layers"]) m.dense_layers.push_back(v.get<int>());
    if (m.n_experts <= 0 || m.top_k <= 0 || m.top_k > m.n_experts || m.expert_intermediate <= 0 || m.sparse_step <= 0)
      fail(src, ": mixture of experts needs num_experts >= num_experts_per_tok >= 1, a positive expert "
           "intermediate size and decoder_sparse_step >= 1");
  }

  // Qwen2 configs carry a sliding_window with use_sliding_window false: no window then
  if (j.contains("sliding_window") && !j["sliding_window"].is_null() && get_or<bool>(j, "use_sliding_window", true, src)) {
    c.sliding_window = get_or<int64_t>(j, "sliding_window", 0, src);
    if (c.sliding_window < 0) fail(src, ": sliding_window must be a non-negative integer or null");
    if (c.sliding_window >= c.max_positions) c.sliding_window = 0;  // spans every position the model takes
  }
  c.sliding_layers.assign(size_t(c.n_layers), c.sliding_window > 0);
  if (c.sliding_window > 0 && j.contains("layer_types") && j["layer_types"].is_array()) {
    if (int(j["layer_types"].size()) != c.n_layers) fail(src, ": layer_types must name each of the ", c.n_layers, " layers");
    for (int i = 0; i < c.n_layers; ++i) {
      const std::string t = j["layer_types"][size_t(i)].is_string() ? j["layer_types"][size_t(i)].get<std::string>() : "";
      if (t != "sliding_attention" && t != "full_attention") fail(src, ": layer type '", t, "' is not supported");
      c.sliding_layers[size_t(i)] = t == "sliding_attention";
    }
  }

  std::string dt = get_or<std::string>(j, "dtype", get_or<std::string>(j, "torch_dtype", "bfloat16", src), src);
  if (dt == "bfloat16") c.weights_dtype = DType::BF16;
  else if (dt == "float16") c.weights_dtype = DType::F16;
  else if (dt == "float32") c.weights_dtype = DType::F32;
  else fail(src, ": dtype '", dt, "' is not supported (bfloat16, float16, float32)");
  if (j.contains("quantization_config") && !j["quantization_config"].is_null())
    c.quantization_config = j["quantization_config"];
  if (j.contains("eos_token_id")) c.eos_ids = id_list(j["eos_token_id"]);
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_id = j["bos_token_id"].get<int32_t>();
  return c;
}

bool MoeConfig::sparse(int layer) const {
  if (n_experts <= 0 || (layer + 1) % sparse_step != 0) return false;
  for (int d : dense_layers)
    if (d == layer) return false;
  return true;
}

ModelConfig parse_model_config(const json& j, const std::string& src) {
  try {
    return parse_model_config_impl(j, src);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type deep inside an object
    fail(src, ": unexpected value (", e.what(), ")");
  }
}

ModelConfig load_model_config(const std::string& model_dir) {
  const std::string path = (fs::path(model_dir) / "config.json").string();
  if (!fs::exists(path)) fail(model_dir, ": no config.json (is this a Hugging Face model folder?)");
  return parse_model_config(read_json(path), path);
}

GenerationConfig load_generation_config(const std::string& model_dir) {
  GenerationConfig g;
  const std::string path = (fs::path(model_dir) / "generation_config.json").string();
  if (!fs::exists(path)) return g;
  const json j = read_json(path);
  g.present = true;
  if (j.contains("eos_token_id")) g.eos_ids = id_list(j["eos_token_id"]);
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) g.bos_id = j["bos_token_id"].get<int32_t>();
  g.do_sample = get_or<bool>(j, "do_sample", false, path);
  g.temperature = get_or<float>(j, "temperature", 1.0f, path);
  g.top_p = get_or<float>(j, "top_p", 1.0f, path);
  g.top_k = get_or<int>(j, "top_k", 50, path);
  g.repetition_penalty = get_or<float>(j, "repetition_penalty", 1.0f, path);
  return g;
}

}  // namespace nf4flash
