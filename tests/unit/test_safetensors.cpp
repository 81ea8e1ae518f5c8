// safetensors reader and model binding: every malformed input is one Error naming the file or
// tensor, never a crash or an out-of-bounds read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/hf_config.h"
#include "nf4flash/engine.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;
namespace fs = std::filesystem;

namespace {

// A path in this test process's scratch folder (removed when the process exits).
fs::path tmp_file(const std::string& name) {
  static const TempDir dir("nf4flash_st");
  return dir.path / name;
}

// A raw safetensors file: 8-byte length, header text, then `data_bytes` bytes.
fs::path raw_file(const std::string& name, const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
  const fs::path p = tmp_file(name);
  std::ofstream out(p, std::ios::binary);
  const uint64_t n = claimed_len ? claimed_len : header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data_bytes, '\x01');
  return p;
}

void expect_error(const fs::path& p, const std::string& must_contain) {
  try {
    SafetensorsFile f(p.string());
    ADD_FAILURE() << "no error for " << p;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(must_contain), std::string::npos) << e.what();
  }
}

TEST(Safetensors, ReadsWhatItWrites) {
  const float a[3] = {1.5f, -2.0f, 3.25f};
  const uint16_t b[4] = {1, 2, 3, 4};
  const fs::path p = tmp_file("rt.safetensors");
  write_safetensors(p.string(), {{"a", DType::F32, {3}, a, sizeof a}, {"b", DType::BF16, {2, 2}, b, sizeof b}}, {{"format", "pt"}});
  SafetensorsFile f(p.string());
  ASSERT_NE(f.find("a"), nullptr);
  EXPECT_EQ(f.find("b")->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::memcmp(f.find("a")->data, a, sizeof a), 0);
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(Safetensors, MalformedFilesAreErrorsNamingTheProblem) {
  expect_error(tmp_file("missing.safetensors"), "cannot open");
  {
    const fs::path p = tmp_file("short.safetensors");
    std::ofstream(p, std::ios::binary) << "abc";
    expect_error(p, "shorter than");
  }
  expect_error(raw_file("hlen.safetensors", "{}", 0, 1000000), "header length");
  expect_error(raw_file("json.safetensors", "{not json", 0), "not valid JSON");
  expect_error(raw_file("range.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "outside the data region");
  expect_error(raw_file("size.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 16), "expected 16");
  expect_error(raw_file("overlap.safetensors",
                        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 16),
               "overlap");
  expect_error(raw_file("dtype.safetensors", R"({"w":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}})", 4), "unsupported dtype");
  expect_error(raw_file("neg.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "bad dimension");
  expect_error(raw_file("keys.safetensors", R"({"w":{"dtype":"F32","shape":[1]}})", 4), "lacks");
}

// Model folders whose tensors do not fit the config: wrong shape, wrong dtype, missing tensor.
fs::path model_with(const std::string& name, const std::function<void(std::vector<TensorToWrite>&, std::vector<std::vector<uint8_t>>&)>& edit) {
  const fs::path d = tmp_file(name);
  fs::create_directories(d);
  fs::copy_file(model_dir("llama-gqa-hd64") + "/config.json", d / "config.json", fs::copy_options::overwrite_existing);
  SafetensorsFile src(model_dir("llama-gqa-hd64") + "/model.safetensors");
  std::vector<TensorToWrite> ts;
  std::vector<std::vector<uint8_t>> keep;
  for (const auto& t : src.tensors()) ts.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
  edit(ts, keep);
  write_safetensors((d / "model.safetensors").string(), ts);
  return d;
}

void expect_load_error(const fs::path& dir, const std::string& must_contain) {
  LoadOptions o;
  o.model_dir = dir.string();
  o.device = DeviceChoice::CPU;
  o.load_tokenizer = false;
  o.ctx_size = 16;
  try {
    Engine::load(o);
    ADD_FAILURE() << "no error for " << dir;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(must_contain), std::string::npos) << e.what();
  }
}

TEST(ModelBinding, WrongShapeDtypeOrMissingTensorIsNamed) {
  const std::string q = "model.layers.1.self_attn.k_proj.weight";  // [128, 256]
  expect_load_error(model_with("shape", [&](auto& ts, auto&) {
                      for (auto& t : ts)
                        if (t.name == q) t.shape = {t.shape[1], t.shape[0]};
                    }),
                    q);
  expect_load_error(model_with("missing", [&](auto& ts, auto&) {
                      ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const auto& t) { return t.name == q; }), ts.end());
                    }),
                    "missing tensor " + q);
  const std::string norm = "model.norm.weight";
  expect_load_error(model_with("dtype", [&](auto& ts, auto& keep) {
                      for (auto& t : ts)
                        if (t.name == norm) {
                          t.dtype = DType::U8;  // 256 bytes of the 512 stay: shape [256] of U8
                          t.nbytes /= 2;
                        }
                    }),
                    norm);
}

TEST(ModelBinding, EmptyTokenListIsAnError) {
  LoadOptions o;
  o.model_dir = model_dir("llama-gqa-hd64");
  o.device = DeviceChoice::CPU;
  o.load_tokenizer = false;
  o.ctx_size = 16;
  auto e = Engine::load(o);
  EXPECT_THROW(e->score({}), Error);
  EXPECT_THROW(e->generate({}, GenerateOptions{}), Error);
}

}  // namespace

namespace {
// Found by tests/fuzz/fuzz_config.cpp: a non-string architecture and a string where an id belongs.
TEST(ConfigReader, WrongJsonTypesAreErrorsNotExceptionsFromTheJsonLibrary) {
  const auto bad1 = nlohmann::json::parse(R"({"architectures": [0], "bos_token_id": "max_positibemfdin"})");
  EXPECT_THROW(nf4flash::parse_model_config(bad1, "config.json"), nf4flash::Error);
  const auto bad2 = nlohmann::json::parse(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "rope_scaling": {"rope_type": 3}})");
  EXPECT_THROW(nf4flash::parse_model_config(bad2, "config.json"), nf4flash::Error);
}
}  // namespace

namespace {
// A config with sliding_window below max_position_embeddings: the CPU backend attends over the
// window (the context is not limited; Gemma's goldens check the window itself); Qwen2's
// use_sliding_window false means no window; layer_types picks the sliding layers.
TEST(ConfigReader, SlidingWindowLayers) {
  const fs::path d = tmp_file("window");
  fs::create_directories(d);
  auto cfg = nlohmann::json::parse(std::ifstream(model_dir("llama-gqa-hd64") + "/config.json"));
  cfg["sliding_window"] = 100;
  std::ofstream(d / "config.json") << cfg.dump();
  fs::copy_file(model_dir("llama-gqa-hd64") + "/model.safetensors", d / "model.safetensors",
                fs::copy_options::overwrite_existing);
  LoadOptions o;
  o.model_dir = d.string();
  o.device = DeviceChoice::CPU;
  o.load_tokenizer = false;
  o.ctx_size = 200;
  EXPECT_EQ(Engine::load(o)->ctx_size(), 200);
  ModelConfig c = nf4flash::parse_model_config(cfg, "config.json");
  EXPECT_EQ(c.sliding_window, 100);
  EXPECT_EQ(c.sliding_layers, std::vector<bool>(3, true));
  cfg["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  EXPECT_EQ(nf4flash::parse_model_config(cfg, "config.json").sliding_layers, (std::vector<bool>{true, false, true}));
  cfg["layer_types"] = {"sliding_attention"};
  EXPECT_THROW(nf4flash::parse_model_config(cfg, "config.json"), Error);
  cfg.erase("layer_types");
  cfg["use_sliding_window"] = false;
  EXPECT_EQ(nf4flash::parse_model_config(cfg, "config.json").sliding_window, 0);
}

// longrope: both factor lists of head_dim / 2 numbers, and the attention factor transformers
// derives from max_position_embeddings / original_max_position_embeddings.
TEST(ConfigReader, LongRopeFactorsAndAttentionFactor) {
  auto cfg = nlohmann::json::parse(std::ifstream(model_dir("phi3-longrope-hd96") + "/config.json"));
  const ModelConfig c = nf4flash::parse_model_config(cfg, "config.json");
  EXPECT_EQ(c.rope.type, "longrope");
  EXPECT_EQ(c.rope.short_factor.size(), 48u);
  EXPECT_EQ(c.rope.long_factor.size(), 48u);
  EXPECT_EQ(c.rope.original_max_positions, 64);
  EXPECT_NEAR(c.rope.attention_factor, std::sqrt(2.0), 1e-12);  // factor 4096 / 64 = 64
  cfg["rope_parameters"]["long_factor"].erase(0);
  EXPECT_THROW(nf4flash::parse_model_config(cfg, "config.json"), Error);
}
}  // namespace
