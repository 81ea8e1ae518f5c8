#include "io/bnb_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "io/bnb_checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "quant/blockwise.h"

namespace nf4flash {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Files copied next to the weights when the source has them (tokenizer and generation settings).
bool is_aux_file(const std::string& f) {
  static const char* kNames[] = {"generation_config.json", "special_tokens_map.json",
                                 "added_tokens.json",      "chat_template.jinja",
                                 "chat_template.json",     "vocab.json",
                                 "vocab.txt",              "merges.txt",
                                 "spiece.model",           "preprocessor_config.json"};
  for (const char* n : kNames)
    if (f == n) return true;
  return f.rfind("tokenizer", 0) == 0;  // tokenizer.json, tokenizer_config.json, tokenizer.model
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(p.string(), ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  if (!out) fail(p.string(), ": cannot create (", std::strerror(errno), ")");
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
  out.flush();
  if (!out) fail(p.string(), ": write failed (", std::strerror(errno), ")");
}

bool dir_is_empty(const fs::path& p) {
  std::error_code ec;
  return fs::directory_iterator(p, ec) == fs::directory_iterator();
}

// Removes the temporary folder unless committed.
struct TempDirGuard {
  fs::path path;
  bool committed = false;
  ~TempDirGuard() {
    if (!committed && !path.empty()) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  }
};

}  // namespace

bool is_bnb_linear_weight_name(const std::string& name, bool quant_lm_head) {
  if (quant_lm_head && name == "lm_head.weight") return true;
  // every nn.Linear of the decoder layers: attention, the dense MLP, Qwen2-MoE's shared expert and
  // its gate. Mixture-of-experts experts and routers are not nn.Linear in transformers 5 (fused 3-D
  // expert parameters, TopKRouter modules): bitsandbytes leaves them in the source dtype.
  static const std::regex re(
      R"(model\.layers\.[0-9]+\.(self_attn\.(q|k|v|o|qkv)_proj|mlp\.(gate|up|down|gate_up)_proj|)"
      R"(mlp\.shared_expert\.(gate|up|down)_proj|mlp\.shared_expert_gate)\.weight)");
  return std::regex_match(name, re);
}

std::string hf_json_text(const json& j) { return j.dump(2) + "\n"; }

json bnb_checkpoint_config(const json& source, const QuantizeCheckpointOptions& opt, DType weights_dtype) {
  json out = source;
  // transformers 5: "dtype" replaces "torch_dtype".
  if (out.contains("torch_dtype")) {
    if (!out.contains("dtype") || out["dtype"].is_null()) out["dtype"] = out["torch_dtype"];
    out.erase("torch_dtype");
  }
  if (!out.contains("dtype") || out["dtype"].is_null()) out["dtype"] = torch_dtype_name(weights_dtype);
  // transformers 5: rope_theta and rope_scaling fold into rope_parameters.
  if (!out.contains("rope_parameters") && (out.contains("rope_theta") || out.contains("rope_scaling"))) {
    json rp = out.contains("rope_scaling") && out["rope_scaling"].is_object() ? out["rope_scaling"]
                                                                              : json::object();
    if (!rp.contains("rope_type")) {
      if (rp.contains("type")) {
        rp["rope_type"] = rp["type"];
        rp.erase("type");
      } else {
        rp["rope_type"] = "default";
      }
    }
    if (out.contains("rope_theta")) rp["rope_theta"] = out["rope_theta"];
    out.erase("rope_theta");
    out.erase("rope_scaling");
    out["rope_parameters"] = rp;
  }
  json q = bnb_quant_config_json(opt.quant, opt.double_quant, opt.compute_dtype);
  // transformers skips lm_head unless llm_int8_skip_modules is given: an empty list converts it.
  if (opt.quant_lm_head) q["llm_int8_skip_modules"] = json::array();
  if (opt.blocksize != 64) q["bnb_4bit_blocksize"] = opt.blocksize;
  out["quantization_config"] = q;
  return out;
}

QuantizeCheckpointResult quantize_checkpoint(const QuantizeCheckpointOptions& opt,
                                             const QuantizeProgressFn& progress) {
  // ---- options ----
  if (opt.quant != QuantType::NF4 && opt.quant != QuantType::FP4)
    fail("--quant: must be nf4 or fp4, got ", quant_type_name(opt.quant));
  if (!valid_blocksize_4bit(opt.blocksize))
    fail("--blocksize: ", opt.blocksize, " is not one of 32, 64, 128, 256, 512, 1024, 2048, 4096");
  if (opt.compute_dtype != DType::BF16 && opt.compute_dtype != DType::F16 && opt.compute_dtype != DType::F32)
    fail("--compute-dtype: must be bf16, f16 or f32");
  if (opt.model_dir.empty()) fail("--model: no source folder given");
  if (opt.out_dir.empty()) fail("--out: no destination folder given");

  // ---- source ----
  const fs::path src(opt.model_dir);
  std::error_code ec;
  if (!fs::is_directory(src, ec)) fail("--model ", opt.model_dir, ": not a folder");
  const fs::path cfg_path = src / "config.json";
  if (!fs::is_regular_file(cfg_path, ec)) fail(cfg_path.string(), ": not found");
  json src_cfg;
  try {
    src_cfg = json::parse(read_file(cfg_path));
  } catch (const json::exception& e) {
    fail(cfg_path.string(), ": invalid JSON (", e.what(), ")");
  }
  if (!src_cfg.is_object()) fail(cfg_path.string(), ": not a JSON object");
  if (src_cfg.contains("quantization_config") && !src_cfg["quantization_config"].is_null())
    fail(cfg_path.string(), ": the model is already quantized (quantization_config present); ",
         "quantize needs a bf16/f16/f32 checkpoint");
  const ModelConfig cfg = parse_model_config(src_cfg, cfg_path.string());
  (void)resolve_arch(cfg);  // refuses unknown architectures by name

  auto store = WeightStore::open_dir(src.string());
  const std::vector<std::string> names = store->names();
  std::vector<std::string> qnames;
  std::vector<TensorToWrite> plain;
  for (const std::string& n : names)
    if (n.find(".quant_state.") != std::string::npos || n.ends_with(".absmax"))
      fail(store->get(n).file, ": tensor ", n, " is a bitsandbytes quantization tensor; the model is already quantized");
  for (const std::string& n : names) {
    const TensorInfo& t = store->get(n);
    if (is_bnb_linear_weight_name(n, opt.quant_lm_head)) {
      if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32)
        fail(t.file, ": tensor ", n, " has dtype ", dtype_name(t.dtype),
             "; quantize needs BF16, F16 or F32 weights (already quantized?)");
      if (t.shape.size() != 2 || t.shape[0] <= 0 || t.shape[1] <= 0)
        fail(t.file, ": tensor ", n, " has shape ", t.shape_str(), ", expected a 2-D weight");
      qnames.push_back(n);
    } else {
      plain.push_back({n, t.dtype, t.shape, t.data, t.nbytes});
    }
  }
  if (opt.quant_lm_head && !store->find("lm_head.weight"))
    fail("--quant-lm-head: ", opt.model_dir, " has no lm_head.weight (tied to the embeddings)");
  if (qnames.empty()) fail(opt.model_dir, ": no decoder linear weights (model.layers.N.*_proj.weight) found");

  // ---- destination ----
  const fs::path out = fs::absolute(fs::path(opt.out_dir)).lexically_normal();
  fs::path out_clean = out;
  if (!out_clean.has_filename()) out_clean = out_clean.parent_path();  // trailing slash
  {
    const fs::path a = fs::weakly_canonical(src, ec), b = fs::weakly_canonical(out_clean, ec);
    if (a == b) fail("--out ", opt.out_dir, ": is the source folder");
  }
  const bool out_exists = fs::exists(fs::symlink_status(out_clean, ec));
  if (out_exists) {
    if (!fs::is_directory(out_clean, ec)) fail("--out ", opt.out_dir, ": exists and is not a folder");
    if (!dir_is_empty(out_clean) && !opt.force)
      fail("--out ", opt.out_dir, ": exists and is not empty (use --force to replace it)");
  }
  const fs::path parent = out_clean.parent_path();
  if (!fs::is_directory(parent, ec)) fail("--out ", opt.out_dir, ": parent folder ", parent.string(), " does not exist");

  TempDirGuard tmp;
  {
    std::string templ = out_clean.string() + ".tmp-XXXXXX";
    if (!::mkdtemp(templ.data()))
      fail("--out ", opt.out_dir, ": cannot create a temporary folder in ", parent.string(), " (",
           std::strerror(errno), ")");
    tmp.path = templ;
  }

  // ---- quantize ----
  Quant4Options qo;
  qo.type = opt.quant;
  qo.blocksize = opt.blocksize;
  qo.double_quant = opt.double_quant;
  std::deque<Quant4Tensor> qts;
  std::vector<std::pair<std::string, const Quant4Tensor*>> quantized;
  const int N = static_cast<int>(qnames.size());
  const DType wdt = store->get(qnames.front()).dtype;
  for (int k = 0; k < N; ++k) {
    const std::string& n = qnames[k];
    if (progress) progress(k + 1, N, n);
    const TensorInfo& t = store->get(n);
    qts.push_back(quantize_4bit(t.data, t.dtype, t.shape[0], t.shape[1], qo));
    quantized.emplace_back(n, &qts.back());
    store->release(n);
  }

  QuantizeCheckpointResult r;
  r.bytes_before = store->total_bytes();
  r.n_quantized = N;
  r.n_plain = static_cast<int>(plain.size());

  // ---- write ----
  const BnbTensorSet set = make_bnb_tensor_set(quantized, plain);
  for (const TensorToWrite& t : set.tensors) r.bytes_after += t.nbytes;
  const fs::path st = tmp.path / "model.safetensors";
  write_safetensors(st.string(), set.tensors, {{"format", "pt"}});
  r.file_bytes = fs::file_size(st, ec);

  write_file(tmp.path / "config.json", hf_json_text(bnb_checkpoint_config(src_cfg, opt, wdt)));
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string f = e.path().filename().string();
    if (!e.is_regular_file() || !is_aux_file(f)) continue;
    fs::copy_file(e.path(), tmp.path / f, fs::copy_options::overwrite_existing, ec);
    if (ec) fail(e.path().string(), ": cannot copy to ", tmp.path.string(), " (", ec.message(), ")");
    r.copied_files.push_back(f);
  }

  // ---- commit: rename the finished folder into place ----
  fs::path old;
  if (out_exists && !dir_is_empty(out_clean)) {  // --force: move the old folder aside first
    old = tmp.path.string() + ".old";
    fs::rename(out_clean, old, ec);
    if (ec) fail("--out ", opt.out_dir, ": cannot move the existing folder aside (", ec.message(), ")");
  } else if (out_exists) {
    fs::remove(out_clean, ec);  // empty folder
  }
  fs::rename(tmp.path, out_clean, ec);
  if (ec) {
    if (!old.empty()) {
      std::error_code ec2;
      fs::rename(old, out_clean, ec2);
    }
    fail("--out ", opt.out_dir, ": cannot rename ", tmp.path.string(), " into place (", ec.message(), ")");
  }
  tmp.committed = true;
  if (!old.empty()) fs::remove_all(old, ec);
  return r;
}

}  // namespace nf4flash
