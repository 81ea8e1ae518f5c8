// nf4flash quantize: the written bitsandbytes folder reloads to the same packed weights and the
// same log-probs as quantize-on-load, matches what transformers wrote in the -bnb-* fixtures
// (tensor names, order, dtypes, shapes, quant_state JSON, config.json), never leaves a half-written
// destination, and refuses bad flags / sources with one error line.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/bnb_checkpoint.h"
#include "io/bnb_writer.h"
#include "io/safetensors.h"
#include "nf4flash/engine.h"
#include "quant/blockwise.h"
#include "test_util.h"

using namespace nf4flash;
using nf4flash::test::CliResult;
using nf4flash::test::run_cli;
using nf4flash::test::slurp;
using nf4flash::test::TempDir;
using nf4flash::test::ulp_diff;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

// Names of a safetensors file in file (offset) order.
std::vector<std::string> file_order(const SafetensorsFile& f) {
  std::vector<const TensorInfo*> v;
  for (const auto& t : f.tensors()) v.push_back(&t);
  std::stable_sort(v.begin(), v.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  std::vector<std::string> out;
  for (const auto* t : v) out.push_back(t->name);
  return out;
}

bool bytes_equal(const TensorInfo& a, const TensorInfo& b) {
  return a.nbytes == b.nbytes && std::memcmp(a.data, b.data, a.nbytes) == 0;
}

void expect_same_quant4(const Quant4Tensor& a, const Quant4Tensor& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  EXPECT_EQ(a.blocksize, b.blocksize);
  EXPECT_EQ(a.orig_dtype, b.orig_dtype);
  EXPECT_TRUE(a.code == b.code);
  EXPECT_TRUE(a.packed == b.packed);
  EXPECT_EQ(a.double_quant, b.double_quant);
  EXPECT_TRUE(a.absmax == b.absmax);
  EXPECT_TRUE(a.absmax_q == b.absmax_q);
  EXPECT_TRUE(a.nested_absmax == b.nested_absmax);
  if (a.double_quant) {
    EXPECT_TRUE(a.nested_code == b.nested_code);
    EXPECT_EQ(a.nested_blocksize, b.nested_blocksize);
    EXPECT_EQ(std::memcmp(&a.offset, &b.offset, 4), 0);
  }
}

const std::vector<int32_t> kTokens = {1, 17, 300, 42, 999, 7, 64, 512, 3, 250, 801, 2, 90, 444};

std::vector<float> score(LoadOptions o) {
  o.device = DeviceChoice::CPU;
  o.compute = ComputeDType::BF16;
  o.load_tokenizer = false;
  auto e = Engine::load(o);
  return e->score(kTokens).next_token_logprobs;
}

// Quantizes `model` with the CLI and checks everything against quantize-on-load and the fixture.
void round_trip(const std::string& model, const std::string& quant, bool dq) {
  TempDir td("nf4flash_quantize");
  const std::string base = test::model_dir(model);
  const std::string fixture = test::model_dir(model + "-bnb-" + quant);
  const std::string out = td / "out";
  const CliResult r = run_cli("quantize --model " + q(base) + " --out " + q(out) + " --quant " + quant +
                                  (dq ? " --double-quant" : "") + " --compute-dtype bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("tensor 21/21"), std::string::npos) << r.err;  // progress: 3 layers x 7
  EXPECT_NE(r.out.find("bytes before"), std::string::npos) << r.out;
  for (const auto& e : fs::directory_iterator(td.path))  // no temporary folder left behind
    EXPECT_EQ(e.path().filename().string().find("out.tmp-"), std::string::npos) << e.path();

  // Files: exactly what transformers' folder has.
  std::vector<std::string> files, ref_files;
  for (const auto& e : fs::directory_iterator(out)) files.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(fixture)) ref_files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  std::sort(ref_files.begin(), ref_files.end());
  EXPECT_EQ(files, ref_files);
  // config.json byte for byte as transformers 5 wrote it; generation_config.json copied.
  EXPECT_EQ(slurp(fs::path(out) / "config.json"), slurp(fs::path(fixture) / "config.json"));
  EXPECT_EQ(slurp(fs::path(out) / "generation_config.json"), slurp(fs::path(base) / "generation_config.json"));

  // Tensors: names in the same file order, dtypes, shapes; quant_state JSON.
  SafetensorsFile got(out + "/model.safetensors"), ref(fixture + "/model.safetensors");
  EXPECT_EQ(got.metadata(), ref.metadata());
  EXPECT_EQ(got.metadata().at("format"), "pt");
  ASSERT_EQ(file_order(got), file_order(ref));
  auto src = WeightStore::open_dir(base);
  int qs_exact = 0, qs_total = 0;
  for (const auto& t : got.tensors()) {
    SCOPED_TRACE(t.name);
    const TensorInfo* f = ref.find(t.name);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(t.dtype, f->dtype);
    EXPECT_EQ(t.shape, f->shape);
    if (t.name.find(".quant_state.") != std::string::npos) {
      ++qs_total;
      const std::string a(reinterpret_cast<const char*>(t.data), t.nbytes);
      const std::string b(reinterpret_cast<const char*>(f->data), f->nbytes);
      if (a == b) {
        ++qs_exact;
        continue;
      }
      // The double-quant offset may be one float32 ulp off the GPU's mean (see quant/blockwise.h);
      // everything else in the JSON must be identical.
      json ja = json::parse(a), jb = json::parse(b);
      ASSERT_TRUE(ja.contains("nested_offset")) << a << " vs " << b;
      EXPECT_LE(ulp_diff(ja["nested_offset"].get<float>(), jb["nested_offset"].get<float>()), 1) << a << " vs " << b;
      ja.erase("nested_offset");
      jb.erase("nested_offset");
      EXPECT_EQ(ja, jb);
    } else if (const TensorInfo* s = src->find(t.name)) {
      if (!is_bnb_linear_weight_name(t.name, false)) {
        EXPECT_TRUE(bytes_equal(t, *s)) << "plain tensor changed";
      }
    }
  }
  EXPECT_EQ(qs_total, 21);
  if (!dq) {
    EXPECT_EQ(qs_exact, qs_total);  // no offset in plain quant_state: byte-identical JSON
  }
  std::printf("[ info ] %s %s: %d/%d quant_state JSON byte-identical to the fixture\n", model.c_str(),
              quant.c_str(), qs_exact, qs_total);

  // Packed weights: the written folder reads back to exactly what quantize-on-load computes;
  // the packed codes equal transformers' too.
  auto written = WeightStore::open_dir(out);
  auto fixture_store = WeightStore::open_dir(fixture);
  Quant4Options qo;
  qo.type = quant == "nf4" ? QuantType::NF4 : QuantType::FP4;
  qo.double_quant = dq;
  for (const auto& name : src->names()) {
    if (!is_bnb_linear_weight_name(name, false)) continue;
    SCOPED_TRACE(name);
    ASSERT_TRUE(is_bnb_quantized(*written, name));
    const TensorInfo& w = src->get(name);
    const Quant4Tensor expect = quantize_4bit(w.data, w.dtype, w.shape[0], w.shape[1], qo);
    const Quant4Tensor back = read_bnb_weight(*written, name);
    expect_same_quant4(back, expect);
    EXPECT_TRUE(back.packed == read_bnb_weight(*fixture_store, name).packed);
  }

  // Logits: loading the folder as is == quantize-on-load of the base folder, exactly.
  LoadOptions pre;
  pre.model_dir = out;
  LoadOptions qol;
  qol.model_dir = base;
  qol.quant = quant == "nf4" ? QuantChoice::NF4 : QuantChoice::FP4;
  qol.double_quant = dq;
  const std::vector<float> a = score(pre), b = score(qol);
  ASSERT_EQ(a.size(), kTokens.size() - 1);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "position " << i << ": " << a[i] << " vs " << b[i];
}

// One line on stderr, "error: ..." mentioning `needle`; non-zero exit; nothing at `out`.
void expect_refused(const CliResult& r, const std::string& needle, const std::string& out = "") {
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  if (!out.empty()) {
    EXPECT_FALSE(fs::exists(out)) << out;
  }
}

// A copy of a fixture model folder.
void copy_model(const std::string& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), to / e.path().filename());
}

}  // namespace

TEST(QuantizeCmd, RoundTripLlamaNf4DoubleQuant) { round_trip("llama-gqa-hd64", "nf4", true); }
TEST(QuantizeCmd, RoundTripQwen2BiasFp4) { round_trip("qwen2-bias", "fp4", false); }
TEST(QuantizeCmd, RoundTripLlama3RopeScaledNf4) { round_trip("llama3-hd128-ropescaled", "nf4", true); }

// Sharded source with tokenizer files: same model.safetensors as from the single file, and the
// tokenizer / chat template files are copied; blocksize and lm_head options reach the config.
TEST(QuantizeCmd, ShardedSourceTokenizerFilesAndOptions) {
  TempDir td("nf4flash_quantize");
  const std::string base = test::model_dir("llama-gqa-hd64");
  const fs::path sh = td.path / "sharded";
  fs::create_directories(sh);
  fs::copy_file(fs::path(base) / "config.json", sh / "config.json");
  fs::copy_file(fs::path(base) / "generation_config.json", sh / "generation_config.json");
  {
    SafetensorsFile f(base + "/model.safetensors");
    std::vector<TensorToWrite> a, b;
    json index;
    index["metadata"] = {{"total_size", 0}};
    for (const auto& t : f.tensors()) {
      const bool first = t.name.find("layers.2.") == std::string::npos && t.name != "lm_head.weight";
      (first ? a : b).push_back({t.name, t.dtype, t.shape, t.data, t.nbytes});
      index["weight_map"][t.name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    write_safetensors((sh / "model-00001-of-00002.safetensors").string(), a, {{"format", "pt"}});
    write_safetensors((sh / "model-00002-of-00002.safetensors").string(), b, {{"format", "pt"}});
    std::ofstream(sh / "model.safetensors.index.json") << index.dump(2);
  }
  std::ofstream(sh / "tokenizer.json") << "{\"fake\": true}";
  std::ofstream(sh / "tokenizer_config.json") << "{}";
  std::ofstream(sh / "special_tokens_map.json") << "{}";
  std::ofstream(sh / "chat_template.jinja") << "{{ messages }}";
  std::ofstream(sh / "notes.txt") << "not copied";

  const CliResult single = run_cli("quantize -q --model " + q(base) + " --out " + q(td / "single") + " --quant nf4 --double-quant");
  ASSERT_EQ(single.code, 0) << single.err;
  const CliResult sharded = run_cli("quantize -q --model " + q(sh.string()) + " --out " + q(td / "fromshards") + " --quant nf4 --double-quant");
  ASSERT_EQ(sharded.code, 0) << sharded.err;
  EXPECT_EQ(slurp(td / "single/model.safetensors"), slurp(td / "fromshards/model.safetensors"));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                        "generation_config.json"})
    EXPECT_EQ(slurp(sh / f), slurp(td.path / "fromshards" / f)) << f;
  EXPECT_FALSE(fs::exists(td.path / "fromshards/notes.txt"));
  EXPECT_FALSE(fs::exists(td.path / "fromshards/model.safetensors.index.json"));

  // --blocksize 128 --quant-lm-head --compute-dtype f16: recorded in config.json and quant_state.
  const CliResult opt = run_cli("quantize -q --model " + q(base) + " --out " + q(td / "opt") +
                                    " --quant fp4 --blocksize 128 --quant-lm-head --compute-dtype f16");
  ASSERT_EQ(opt.code, 0) << opt.err;
  const json cfg = json::parse(slurp(td.path / "opt/config.json"));
  EXPECT_EQ(cfg["quantization_config"]["bnb_4bit_compute_dtype"], "float16");
  EXPECT_EQ(cfg["quantization_config"]["bnb_4bit_blocksize"], 128);
  EXPECT_EQ(cfg["quantization_config"]["llm_int8_skip_modules"], json::array());
  auto ws = WeightStore::open_dir(td / "opt");
  ASSERT_TRUE(is_bnb_quantized(*ws, "lm_head.weight"));
  EXPECT_EQ(read_bnb_weight(*ws, "lm_head.weight").blocksize, 128);
  EXPECT_EQ(read_bnb_weight(*ws, "model.layers.1.mlp.down_proj.weight").blocksize, 128);
  EXPECT_FALSE(is_bnb_quantized(*ws, "model.embed_tokens.weight"));
}

TEST(QuantizeCmd, ExistingDestinationNeedsForce) {
  TempDir td("nf4flash_quantize");
  const std::string base = test::model_dir("qwen2-bias");
  const fs::path out = td.path / "out";
  fs::create_directories(out);
  std::ofstream(out / "keep.txt") << "old";
  const CliResult r = run_cli("quantize -q --model " + q(base) + " --out " + q(out.string()) + " --quant fp4");
  expect_refused(r, "--force");
  EXPECT_EQ(slurp(out / "keep.txt"), "old");  // untouched
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));

  const CliResult f = run_cli("quantize -q --force --model " + q(base) + " --out " + q(out.string()) + " --quant fp4");
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_FALSE(fs::exists(out / "keep.txt"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  for (const auto& e : fs::directory_iterator(td.path))  // no .tmp-/.old folders left
    EXPECT_EQ(e.path().filename().string().find("out."), std::string::npos) << e.path();

  // An existing empty folder is fine without --force.
  fs::create_directories(td.path / "empty");
  const CliResult e = run_cli("quantize -q --model " + q(base) + " --out " + q(td / "empty") + " --quant nf4");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_TRUE(fs::exists(td.path / "empty/model.safetensors"));
}

// A run that fails after the temporary folder holds part of the output leaves neither the
// destination nor the temporary folder.
TEST(QuantizeCmd, InterruptedRunLeavesNoOutput) {
  TempDir td("nf4flash_quantize");
  QuantizeCheckpointOptions o;
  o.model_dir = test::model_dir("llama-gqa-hd64");
  o.out_dir = td / "out";
  o.quant = QuantType::NF4;
  o.double_quant = true;
  int calls = 0;
  EXPECT_THROW(quantize_checkpoint(o, [&](int k, int n, const std::string&) {
                 ++calls;
                 EXPECT_EQ(n, 21);
                 bool tmp_exists = false;
                 for (const auto& e : fs::directory_iterator(td.path))
                   tmp_exists |= e.path().filename().string().rfind("out.tmp-", 0) == 0;
                 EXPECT_TRUE(tmp_exists);
                 if (k == 10) throw Error("interrupted");
               }),
               Error);
  EXPECT_EQ(calls, 10);
  EXPECT_TRUE(fs::is_empty(td.path)) << "left behind: " << fs::directory_iterator(td.path)->path();

  // Unwritable destinations: a folder under /proc, a parent that is a file.
  const std::string base = test::model_dir("llama-gqa-hd64");
  expect_refused(run_cli("quantize -q --model " + q(base) + " --out /proc/nf4flash_quantize_test --quant nf4"),
                 "--out", "/proc/nf4flash_quantize_test");
  std::ofstream(td.path / "file") << "x";
  expect_refused(run_cli("quantize -q --model " + q(base) + " --out " + q(td / "file/out") + " --quant nf4"),
                 "--out", td / "file/out");
  expect_refused(run_cli("quantize -q --model " + q(base) + " --out " + q(td / "file") + " --quant nf4"),
                 "not a folder");
}

TEST(QuantizeCmd, BadFlagsAndSourcesOneErrorLine) {
  TempDir td("nf4flash_quantize");
  const std::string base = q(test::model_dir("llama-gqa-hd64"));
  const std::string out = td / "out";
  const std::string o = " --out " + q(out);
  expect_refused(run_cli("quantize --model " + base + o + " --quant int8"), "--quant", out);
  expect_refused(run_cli("quantize --model " + base + o), "--quant", out);
  expect_refused(run_cli("quantize --model " + base + o + " --quant nf4 --blocksize 100"), "--blocksize", out);
  expect_refused(run_cli("quantize --model " + base + o + " --quant nf4 --blocksize abc"), "--blocksize", out);
  expect_refused(run_cli("quantize --model " + base + o + " --quant nf4 --compute-dtype f64"), "--compute-dtype", out);
  expect_refused(run_cli("quantize" + o + " --quant nf4"), "--model", out);
  expect_refused(run_cli("quantize --model " + base + o + " --quant nf4 --bogus"), "--bogus", out);
  expect_refused(run_cli("quantize --model " + base + o + " --quant nf4 --blocksize"), "--blocksize", out);
  expect_refused(run_cli("quantize --model " + base + o + " --quant"), "--quant", out);
  expect_refused(run_cli("quantize --model " + base + " --quant nf4 --out"), "--out");
  expect_refused(run_cli("quantize --model " + base + o + " --quant nf4 extra"), "extra", out);
  expect_refused(run_cli("quantize --model " + base + " --quant nf4"), "--out");
  expect_refused(run_cli("quantize --model " + q(td / "nope") + o + " --quant nf4"), "nope", out);
  {  // --out naming the source (a copy, so that a bug here could not touch the fixture)
    const fs::path self = td.path / "self";
    copy_model(test::model_dir("llama-gqa-hd64"), self);
    expect_refused(run_cli("quantize --model " + q(self.string()) + " --out " + q(self.string() + "/") +
                               " --quant nf4 --force"),
                   "source folder");
    EXPECT_TRUE(fs::exists(self / "model.safetensors"));
    EXPECT_EQ(json::parse(slurp(self / "config.json")).count("quantization_config"), 0u);
  }
  // Already quantized source.
  expect_refused(run_cli("quantize --model " + q(test::model_dir("llama-gqa-hd64-bnb-nf4")) + o + " --quant nf4"),
                 "already quantized", out);
  // Tied lm_head cannot be quantized.
  expect_refused(run_cli("quantize --model " + q(test::model_dir("llama3-hd128-ropescaled")) + o +
                             " --quant nf4 --quant-lm-head"),
                 "--quant-lm-head", out);
  // Unknown architecture.
  const fs::path unk = td.path / "unknown";
  copy_model(test::model_dir("llama-gqa-hd64"), unk);
  {
    json cfg = json::parse(slurp(unk / "config.json"));
    cfg["architectures"] = {"FooBarForCausalLM"};
    std::ofstream(unk / "config.json", std::ios::trunc) << cfg.dump(2);
  }
  expect_refused(run_cli("quantize --model " + q(unk.string()) + o + " --quant nf4"), "FooBarForCausalLM", out);
  // Quantization tensors without quantization_config (config stripped from a bnb folder).
  const fs::path stripped = td.path / "stripped";
  copy_model(test::model_dir("qwen2-bias-bnb-fp4"), stripped);
  {
    json cfg = json::parse(slurp(stripped / "config.json"));
    cfg.erase("quantization_config");
    std::ofstream(stripped / "config.json", std::ios::trunc) << cfg.dump(2);
  }
  expect_refused(run_cli("quantize --model " + q(stripped.string()) + o + " --quant fp4"), "already quantized", out);
  // Broken config.json.
  std::ofstream(unk / "config.json", std::ios::trunc) << "{ not json";
  expect_refused(run_cli("quantize --model " + q(unk.string()) + o + " --quant nf4"), "config.json", out);
}

// An f32 source (the bf16 fixture widened exactly): same packed codes and absmax as from bf16,
// quant_state records "float32", config.json says dtype float32, plain tensors stay f32.
TEST(QuantizeCmd, F32SourceQuantizesLikeBf16) {
  TempDir td("nf4flash_quantize");
  const std::string base = test::model_dir("llama-gqa-hd64");
  const fs::path f32 = td.path / "f32";
  fs::create_directories(f32);
  {
    SafetensorsFile f(base + "/model.safetensors");
    std::deque<std::vector<float>> bufs;
    std::vector<TensorToWrite> ts;
    for (const auto& t : f.tensors()) {
      ASSERT_EQ(t.dtype, DType::BF16);
      auto& v = bufs.emplace_back(t.numel());
      const uint16_t* s = reinterpret_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < t.numel(); ++i) {
        const uint32_t bits = uint32_t{s[i]} << 16;
        std::memcpy(&v[i], &bits, 4);
      }
      ts.push_back({t.name, DType::F32, t.shape, v.data(), v.size() * 4});
    }
    write_safetensors((f32 / "model.safetensors").string(), ts, {{"format", "pt"}});
    json cfg = json::parse(slurp(fs::path(base) / "config.json"));
    cfg["torch_dtype"] = "float32";
    std::ofstream(f32 / "config.json") << cfg.dump(2);
  }
  ASSERT_EQ(run_cli("quantize -q --model " + q(f32.string()) + " --out " + q(td / "o32") + " --quant nf4 --double-quant").code, 0);
  ASSERT_EQ(run_cli("quantize -q --model " + q(base) + " --out " + q(td / "o16") + " --quant nf4 --double-quant").code, 0);
  auto a = WeightStore::open_dir(td / "o32"), b = WeightStore::open_dir(td / "o16");
  EXPECT_EQ(json::parse(slurp(td.path / "o32/config.json"))["dtype"], "float32");
  EXPECT_EQ(a->get("model.embed_tokens.weight").dtype, DType::F32);
  const std::string w = "model.layers.1.self_attn.o_proj.weight";
  const Quant4Tensor qa = read_bnb_weight(*a, w), qb = read_bnb_weight(*b, w);
  EXPECT_EQ(qa.orig_dtype, DType::F32);
  EXPECT_TRUE(qa.packed == qb.packed);
  EXPECT_TRUE(qa.absmax_q == qb.absmax_q);
  EXPECT_TRUE(qa.nested_absmax == qb.nested_absmax);
  const TensorInfo& qs = a->get(w + ".quant_state.bitsandbytes__nf4");
  EXPECT_NE(std::string(reinterpret_cast<const char*>(qs.data), qs.nbytes).find("\"dtype\": \"float32\""), std::string::npos);
}

namespace {

// `quantize` of a fixture (NF4 with double quant, or FP4): the names in `quantized` are written
// 4-bit, those in `dense` are not, and the folder loads back to exactly the log-probs of
// quantizing the base folder on load.
void expect_written_equals_on_load(const std::string& model, bool nf4, const std::vector<std::string>& quantized,
                                   const std::vector<std::string>& dense) {
  SCOPED_TRACE(model + (nf4 ? " nf4" : " fp4"));
  TempDir td("nf4flash_quantize");
  const std::string base = test::model_dir(model);
  const std::string out = td / "out";
  const CliResult r =
      run_cli("quantize --model " + q(base) + " --out " + q(out) + (nf4 ? " --quant nf4 --double-quant" : " --quant fp4"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto written = WeightStore::open_dir(out);
  for (const std::string& n : quantized) EXPECT_TRUE(is_bnb_quantized(*written, n)) << n;
  for (const std::string& n : dense) EXPECT_FALSE(is_bnb_quantized(*written, n)) << n;
  LoadOptions pre;
  pre.model_dir = out;
  LoadOptions qol;
  qol.model_dir = base;
  qol.quant = nf4 ? QuantChoice::NF4 : QuantChoice::FP4;
  qol.double_quant = nf4;
  auto score512 = [](LoadOptions o) {  // these models' vocabularies are 512
    o.device = DeviceChoice::CPU;
    o.load_tokenizer = false;
    return Engine::load(o)->score({1, 17, 300, 42, 99, 7, 64, 511, 3, 250, 81, 2, 90, 444}).next_token_logprobs;
  };
  const std::vector<float> a = score512(pre), b = score512(qol);
  ASSERT_EQ(a.size(), 13u);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "position " << i;
}

}  // namespace

// Phi-3's fused qkv_proj and gate_up_proj are quantized whole (as bitsandbytes quantizes the fused
// Linear), and the folder loads back cut into q/k/v and gate/up.
TEST(QuantizeCmd, FusedProjectionsRoundTrip) {
  expect_written_equals_on_load("phi3-longrope-hd96", true,
                                {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"}, {});
}

// Gemma 2 and 3 ((1 + w) norms kept dense, GeGLU projections 4-bit) and head_dim 80, NF4 with double
// quant and FP4.
TEST(QuantizeCmd, GemmaAndHeadDim80RoundTrip) {
  for (const char* model : {"gemma2-hd256-softcap", "gemma3-qknorm-window", "llama-hd80"})
    for (const bool nf4 : {true, false})
      expect_written_equals_on_load(model, nf4, {"model.layers.1.mlp.gate_proj.weight"},
                                    {"model.layers.1.input_layernorm.weight"});
}

// Mixtures of experts as transformers 5 + bitsandbytes write them: the attention projections,
// Qwen2-MoE's shared expert and its gate 4-bit (nn.Linear), the experts and the routers in the
// source dtype (fused 3-D expert parameters and TopKRouter modules are not nn.Linear). The folder
// loads as it is, its experts dense: its logits move from the f32 golden by the 4-bit attention's
// error only.
TEST(QuantizeCmd, MixtureOfExpertsAsTransformersWritesThem) {
  for (const char* model : {"mixtral-moe", "qwen2moe-shared", "qwen3moe-topk"}) {
    SCOPED_TRACE(model);
    TempDir td("nf4flash_quantize");
    const std::string base = test::model_dir(model);
    const std::string out = td / "out";
    const CliResult r = run_cli("quantize --model " + q(base) + " --out " + q(out) + " --quant nf4 --double-quant");
    ASSERT_EQ(r.code, 0) << r.err;
    auto written = WeightStore::open_dir(out);
    int n4 = 0, n_dense_expert = 0;
    for (const std::string& n : written->names()) {
      if (n.find(".quant_state.") != std::string::npos || n.ends_with(".absmax")) continue;  // (u8 with double quant)
      if (written->get(n).dtype != DType::U8) {
        if (n.find(".experts.") != std::string::npos) ++n_dense_expert;
        continue;
      }
      ++n4;
      EXPECT_EQ(n.find(".experts."), std::string::npos) << n << " is 4-bit";
      EXPECT_FALSE(n.ends_with("mlp.gate.weight") || n.ends_with("block_sparse_moe.gate.weight")) << n << " is 4-bit";
    }
    EXPECT_TRUE(is_bnb_quantized(*written, "model.layers.0.self_attn.q_proj.weight"));
    EXPECT_GT(n_dense_expert, 0);
    const bool shared = std::string(model) == "qwen2moe-shared";
    EXPECT_EQ(n4, 2 * (4 + (shared ? 4 : 0)));  // 2 layers: q/k/v/o (+ shared gate/up/down and its gate)
    if (shared) EXPECT_TRUE(is_bnb_quantized(*written, "model.layers.1.mlp.shared_expert_gate.weight"));
    LoadOptions o;
    o.model_dir = out;
    o.device = DeviceChoice::CPU;
    o.load_tokenizer = false;
    auto e = Engine::load(o);
    EXPECT_EQ(e->report().quant, "nf4");
    EXPECT_TRUE(e->report().prequantized);
    const test::Golden g(model);
    const ScoreResult s = e->score(g.i32("tokens_1"), false, true);
    const double d = test::rel_l2(test::flatten(s.logits, s.logits.size() - 4), g.f32("logits_f32_1"));
    EXPECT_GT(d, 0.005);  // 4-bit attention moves them
    EXPECT_LT(d, 0.3);
  }
}
