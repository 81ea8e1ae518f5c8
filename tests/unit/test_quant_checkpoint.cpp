// bitsandbytes checkpoints: quantizing the base fixture models reproduces the -bnb-nf4/-bnb-fp4
// folders (packed codes bit for bit; double-quant absmax within the README's one-ulp offset
// caveat, counted), reader/writer round trip, quant_state JSON and quantization_config spelling,
// and clear errors for malformed checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/bnb_checkpoint.h"
#include "quant/blockwise.h"
#include "test_quant_util.h"

using namespace nf4flash;
using namespace nf4flash::testq;
using nf4flash::test::ulp_diff;

namespace {

const char* kModels[] = {"llama-gqa-hd64", "llama3-hd128-ropescaled", "qwen2-bias"};
const char* kLinears[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj",   "mlp.up_proj",
                          "mlp.down_proj"};

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(QuantCheckpoint, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(0.0971217155456543), "0.0971217155456543");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(6.0), "6.0");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1.5e-07), "1.5e-07");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(123456.75), "123456.75");
  EXPECT_EQ(python_float_repr(-2.5), "-2.5");
  EXPECT_EQ(python_float_repr(static_cast<float>(0.05859990790486336)), "0.05859990790486336");
}

// Every linear weight of every base model, quantized like transformers + bitsandbytes did.
TEST(QuantCheckpoint, QuantizingBaseModelsReproducesBnbFolders) {
  int64_t weights = 0, packed_bad = 0, plain_absmax_bad = 0, dq_tensors = 0;
  int64_t offset_ulp1 = 0, offset_worse = 0, absmax_code_bad = 0, absmax_code_bad_fixed = 0;
  int64_t nested_bad_fixed = 0, nested_ulp_max = 0, absmax_codes_total = 0, json_bad = 0;
  for (const char* model : kModels) {
    auto base = WeightStore::open_dir(model_dir(model));
    for (const char* tn : {"nf4", "fp4"}) {
      auto bnb = WeightStore::open_dir(model_dir(std::string(model) + "-bnb-" + tn));
      const bool dq = std::string(tn) == "nf4";  // the fixtures: nf4 + double quant, fp4 plain
      for (int layer = 0; layer < 3; ++layer) {
        for (const char* lin : kLinears) {
          const std::string name = "model.layers." + std::to_string(layer) + "." + lin + ".weight";
          SCOPED_TRACE(std::string(model) + "-" + tn + " " + name);
          ASSERT_TRUE(is_bnb_quantized(*bnb, name));
          const Quant4Tensor ref = read_bnb_weight(*bnb, name);
          const TensorInfo& w = base->get(name);
          ASSERT_EQ(w.dtype, DType::BF16);
          ASSERT_EQ(ref.rows, w.shape[0]);
          ASSERT_EQ(ref.cols, w.shape[1]);
          ASSERT_EQ(ref.double_quant, dq);
          const auto wd = tensor_vec<uint16_t>(w);
          const Quant4Tensor q =
              quantize_4bit(wd.data(), DType::BF16, w.shape[0], w.shape[1], ref.type, 64, dq);
          ++weights;
          for (size_t k = 0; k < q.packed.size(); ++k) packed_bad += q.packed[k] != ref.packed[k];
          if (!dq) {
            for (size_t k = 0; k < q.absmax.size(); ++k)
              plain_absmax_bad += bits(q.absmax[k]) != bits(ref.absmax[k]);
            json_bad += bnb_quant_state_json(q) !=
                        std::string(reinterpret_cast<const char*>(
                                        bnb->get(name + ".quant_state.bitsandbytes__fp4").data),
                                    bnb->get(name + ".quant_state.bitsandbytes__fp4").nbytes);
            continue;
          }
          ++dq_tensors;
          const int64_t du = ulp_diff(q.offset, ref.offset);
          offset_ulp1 += du == 1;
          offset_worse += du > 1;
          absmax_codes_total += static_cast<int64_t>(q.absmax_q.size());
          for (size_t k = 0; k < q.absmax_q.size(); ++k) absmax_code_bad += q.absmax_q[k] != ref.absmax_q[k];
          for (size_t k = 0; k < q.nested_absmax.size(); ++k)
            nested_ulp_max = std::max(nested_ulp_max, ulp_diff(q.nested_absmax[k], ref.nested_absmax[k]));
          // With the checkpoint's own offset everything must match bit for bit.
          Quant4Options opt;
          opt.type = ref.type;
          opt.double_quant = true;
          opt.offset = ref.offset;
          const Quant4Tensor qf = quantize_4bit(wd.data(), DType::BF16, w.shape[0], w.shape[1], opt);
          for (size_t k = 0; k < qf.absmax_q.size(); ++k)
            absmax_code_bad_fixed += qf.absmax_q[k] != ref.absmax_q[k];
          for (size_t k = 0; k < qf.nested_absmax.size(); ++k)
            nested_bad_fixed += bits(qf.nested_absmax[k]) != bits(ref.nested_absmax[k]);
          for (int k = 0; k < 256; ++k) ASSERT_EQ(bits(qf.nested_code[k]), bits(ref.nested_code[k]));
          const TensorInfo& qs = bnb->get(name + ".quant_state.bitsandbytes__nf4");
          json_bad += bnb_quant_state_json(qf) !=
                      std::string(reinterpret_cast<const char*>(qs.data), qs.nbytes);
        }
      }
    }
  }
  std::printf("[bnb fixtures] %lld weights: packed bytes differing %lld, plain absmax differing %lld;\n"
              "  double quant (%lld tensors): offset 1 ulp off in %lld, >1 ulp in %lld; nested absmax max "
              "%lld ulp; absmax codes differing %lld of %lld;\n"
              "  with the checkpoint's offset: absmax codes differing %lld, nested absmax differing %lld; "
              "quant_state JSON differing %lld\n",
              (long long)weights, (long long)packed_bad, (long long)plain_absmax_bad, (long long)dq_tensors,
              (long long)offset_ulp1, (long long)offset_worse, (long long)nested_ulp_max,
              (long long)absmax_code_bad, (long long)absmax_codes_total, (long long)absmax_code_bad_fixed,
              (long long)nested_bad_fixed, (long long)json_bad);
  EXPECT_EQ(weights, 3 * 2 * 3 * 7);
  EXPECT_EQ(packed_bad, 0);
  EXPECT_EQ(plain_absmax_bad, 0);
  // The README allows the offset one ulp off the float64 mean (19 of its 84 dq tensors are); our
  // mean reproduces torch's sum * (1/n), so the offset and everything after it is bit exact.
  EXPECT_EQ(offset_worse, 0);
  EXPECT_EQ(offset_ulp1, 0);
  EXPECT_EQ(nested_ulp_max, 0);
  EXPECT_EQ(absmax_code_bad, 0);
  EXPECT_EQ(absmax_code_bad_fixed, 0);  // given bnb's offset: bit for bit
  EXPECT_EQ(nested_bad_fixed, 0);
  EXPECT_EQ(json_bad, 0);
}

TEST(QuantCheckpoint, ReaderMatchesDequantAndConfig) {
  for (const char* tn : {"nf4", "fp4"}) {
    const std::string dir = model_dir(std::string("qwen2-bias-bnb-") + tn);
    const nlohmann::json cfg = read_json(dir + "/config.json");
    ASSERT_TRUE(has_bnb_quant_config(cfg));
    const BnbQuantConfig c = parse_bnb_quant_config(cfg);
    EXPECT_TRUE(c.load_in_4bit);
    EXPECT_EQ(quant_type_name(c.quant_type), tn);
    EXPECT_EQ(c.double_quant, std::string(tn) == "nf4");
    EXPECT_EQ(c.compute_dtype, DType::BF16);
    EXPECT_EQ(c.blocksize, 64);
    EXPECT_TRUE(c.skip_modules.empty());
    // what we would write is exactly what transformers wrote
    EXPECT_EQ(bnb_quant_config_json(c.quant_type, c.double_quant, c.compute_dtype).dump(),
              cfg["quantization_config"].dump());
    auto ws = WeightStore::open_dir(dir);
    EXPECT_FALSE(is_bnb_quantized(*ws, "model.embed_tokens.weight"));
    EXPECT_FALSE(is_bnb_quantized(*ws, "model.layers.0.self_attn.q_proj.bias"));
  }
  EXPECT_FALSE(has_bnb_quant_config(read_json(model_dir("qwen2-bias") + "/config.json")));
}

TEST(QuantCheckpoint, WriteReadRoundTrip) {
  auto bnb = WeightStore::open_dir(model_dir("llama-gqa-hd64-bnb-nf4"));
  auto bnb_fp4 = WeightStore::open_dir(model_dir("llama-gqa-hd64-bnb-fp4"));
  const std::string n1 = "model.layers.1.mlp.down_proj.weight";
  const std::string n2 = "model.layers.0.self_attn.k_proj.weight";
  const Quant4Tensor a = read_bnb_weight(*bnb, n1);
  const Quant4Tensor b = read_bnb_weight(*bnb_fp4, n2);
  const TensorInfo& norm = bnb->get("model.norm.weight");
  const BnbTensorSet set = make_bnb_tensor_set(
      {{n1, &a}, {n2, &b}}, {{norm.name, norm.dtype, norm.shape, norm.data, norm.nbytes}});
  // names, dtypes and shapes exactly as in the fixtures
  for (const TensorToWrite& t : set.tensors) {
    const WeightStore& src = t.name.rfind(n2, 0) == 0 ? *bnb_fp4 : *bnb;
    const TensorInfo& f = src.get(t.name);
    EXPECT_EQ(t.dtype, f.dtype) << t.name;
    EXPECT_EQ(t.shape, f.shape) << t.name;
    ASSERT_EQ(t.nbytes, f.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(t.data, f.data, t.nbytes), 0) << t.name;  // incl. quant_state JSON bytes
  }
  EXPECT_EQ(set.tensors.size(), 6u + 4u + 1u);  // dq: 6 tensors, plain: 4
  EXPECT_EQ(set.tensors.front().dtype, DType::F32);  // safetensors' order: F32, BF16, then U8
  EXPECT_EQ(set.tensors.back().dtype, DType::U8);
  const test::TempDir tmp("nf4flash_quant_ckpt");
  const std::string path = tmp / "roundtrip.safetensors";
  write_safetensors(path, set.tensors, {{"format", "pt"}});
  {
    auto ws = WeightStore::open_file(path);
    const Quant4Tensor a2 = read_bnb_weight(*ws, n1);
    const Quant4Tensor b2 = read_bnb_weight(*ws, n2);
    EXPECT_EQ(a2.packed, a.packed);
    EXPECT_EQ(a2.absmax_q, a.absmax_q);
    EXPECT_EQ(a2.nested_absmax, a.nested_absmax);
    EXPECT_EQ(bits(a2.offset), bits(a.offset));
    EXPECT_EQ(b2.packed, b.packed);
    EXPECT_EQ(b2.absmax, b.absmax);
    std::vector<float> d1(a.numel()), d2(a.numel());
    dequantize_4bit(a, d1.data());
    dequantize_4bit(a2, d2.data());
    EXPECT_EQ(d1, d2);
  }
}

namespace {

// Writes the tensors of `name` from the nf4 fixture with one modification applied, then reads.
void expect_read_error(const std::string& what,
                       const std::function<void(std::vector<TensorToWrite>&, std::deque<std::string>&)>& mutate,
                       const std::string& expect_substr) {
  auto bnb = WeightStore::open_dir(model_dir("llama-gqa-hd64-bnb-nf4"));
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  std::vector<TensorToWrite> ts;
  for (const std::string& n : bnb->names())
    if (n.rfind(name, 0) == 0) {
      const TensorInfo& t = bnb->get(n);
      ts.push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
    }
  ASSERT_EQ(ts.size(), 6u);
  std::deque<std::string> owned;
  mutate(ts, owned);
  const test::TempDir tmp("nf4flash_quant_ckpt");
  const std::string path = tmp / "bad.safetensors";
  write_safetensors(path, ts);
  auto ws = WeightStore::open_file(path);
  try {
    read_bnb_weight(*ws, name);
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(expect_substr), std::string::npos) << what << ": " << msg;
    EXPECT_NE(msg.find("q_proj"), std::string::npos) << what << " does not name the tensor: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << what;
  }
}

TensorToWrite* find_t(std::vector<TensorToWrite>& ts, const std::string& suffix) {
  for (auto& t : ts)
    if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return &t;
  return nullptr;
}

void set_json(std::vector<TensorToWrite>& ts, std::deque<std::string>& owned, const std::string& from,
              const std::string& to) {
  TensorToWrite* qs = find_t(ts, "bitsandbytes__nf4");
  std::string s(static_cast<const char*>(qs->data), qs->nbytes);
  const size_t p = s.find(from);
  ASSERT_NE(p, std::string::npos);
  s.replace(p, from.size(), to);
  const std::string& o = owned.emplace_back(s);
  qs->data = o.data();
  qs->nbytes = o.size();
  qs->shape = {static_cast<int64_t>(o.size())};
}

}  // namespace

TEST(QuantCheckpoint, MalformedCheckpointsGiveErrors) {
  expect_read_error("absmax too short", [](auto& ts, auto&) {
    TensorToWrite* t = find_t(ts, ".absmax");
    t->nbytes -= 1;
    t->shape = {static_cast<int64_t>(t->nbytes)};
  }, "absmax");
  expect_read_error("truncated packed", [](auto& ts, auto&) {
    TensorToWrite* t = find_t(ts, "q_proj.weight");
    t->nbytes -= 64;
    t->shape = {static_cast<int64_t>(t->nbytes), 1};
  }, "packed");
  expect_read_error("missing quant_state", [](auto& ts, auto&) {
    ts.erase(ts.begin() + (find_t(ts, "bitsandbytes__nf4") - ts.data()));
  }, "quant_state");
  expect_read_error("missing nested_absmax", [](auto& ts, auto&) {
    ts.erase(ts.begin() + (find_t(ts, ".nested_absmax") - ts.data()));
  }, "nested");
  expect_read_error("unknown quant_type", [](auto& ts, auto& o) { set_json(ts, o, "\"nf4\"", "\"int4\""); },
                    "quant_type");
  expect_read_error("bad blocksize", [](auto& ts, auto& o) { set_json(ts, o, "\"blocksize\": 64", "\"blocksize\": 48"); },
                    "blocksize");
  expect_read_error("blocksize does not match absmax",
                    [](auto& ts, auto& o) { set_json(ts, o, "\"blocksize\": 64", "\"blocksize\": 128"); },
                    "absmax");
  expect_read_error("shape does not match packed",
                    [](auto& ts, auto& o) { set_json(ts, o, "[256, 256]", "[256, 512]"); }, "256, 512");
  expect_read_error("bad JSON", [](auto& ts, auto& o) { set_json(ts, o, "}", ""); }, "JSON");
  expect_read_error("custom quant_map", [](auto& ts, auto& o) {
    TensorToWrite* t = find_t(ts, ".quant_map");
    std::string s(static_cast<const char*>(t->data), t->nbytes);
    s[4] ^= 1;
    const std::string& k = o.emplace_back(s);
    t->data = k.data();
  }, "code book");
}

TEST(QuantCheckpoint, BadQuantizationConfigs) {
  using nlohmann::json;
  json ok = json::parse(R"({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": true,
      "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true, "bnb_4bit_compute_dtype": "float16",
      "llm_int8_skip_modules": ["lm_head", "mlp.gate"]}})");
  const BnbQuantConfig c = parse_bnb_quant_config(ok);
  EXPECT_EQ(c.compute_dtype, DType::F16);
  EXPECT_EQ(c.skip_modules.size(), 2u);
  json q = ok["quantization_config"];
  EXPECT_EQ(parse_bnb_quant_config(q).quant_type, QuantType::NF4);  // the object itself works too
  auto bad = [&](const char* key, json v, const char* substr) {
    json b = q;
    b[key] = v;
    try {
      parse_bnb_quant_config(b);
      ADD_FAILURE() << key << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) << e.what();
    }
  };
  bad("bnb_4bit_quant_type", "int4", "int4");
  bad("quant_method", "gptq", "gptq");
  bad("load_in_8bit", true, "8-bit");
  bad("bnb_4bit_compute_dtype", "float64", "compute_dtype");
  bad("bnb_4bit_blocksize", 96, "96");
}
