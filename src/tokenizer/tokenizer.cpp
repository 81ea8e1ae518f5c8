// Loading tokenizer.json / tokenizer_config.json into the pipeline, the public Tokenizer API,
// decoding, and the post-processors (TemplateProcessing, Roberta/Bert, ByteLevel, Sequence).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tokenizer_json.h"

namespace nf4flash {
namespace tok {
namespace {

// The whole file as one string (sized once, one read).
std::string read_file_text(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path, ": is a directory, not a JSON file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(path, ": cannot open");
  const std::streamoff n = in.tellg();
  if (n < 0) fail(path, ": cannot read (not a regular file?)");
  std::string s(size_t(n), '\0');
  in.seekg(0);
  if (n > 0 && !in.read(s.data(), n)) fail(path, ": cannot read");
  return s;
}

nlohmann::json read_json(const std::string& path) {
  const std::string text = read_file_text(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

// A token given as "text", {"content": "text", ...} or null.
std::string token_string(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return {};
}

PostProcessor parse_post(const nlohmann::json& j, const std::string& where) {
  PostProcessor pp;
  if (j.is_null()) return pp;
  std::string type = j.value("type", "");
  if (type == "ByteLevel") return pp;
  if (type == "Sequence") {
    for (const auto& sub : j.at("processors")) {
      PostProcessor inner = parse_post(sub, where);
      pp.prefix.insert(pp.prefix.begin(), inner.prefix.begin(), inner.prefix.end());
      pp.suffix.insert(pp.suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
    return pp;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    pp.prefix.push_back(j.at("cls").at(1).get<int32_t>());
    pp.suffix.push_back(j.at("sep").at(1).get<int32_t>());
    return pp;
  }
  if (type == "TemplateProcessing") {
    const auto& specials = j.at("special_tokens");
    bool seen_a = false;
    for (const auto& item : j.at("single")) {
      if (item.contains("Sequence")) {
        if (seen_a) fail(where, ": post_processor TemplateProcessing 'single' has two sequences");
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        std::string id = item["SpecialToken"].at("id").get<std::string>();
        if (!specials.contains(id))
          fail(where, ": post_processor TemplateProcessing uses special token '", id, "' missing from special_tokens");
        for (const auto& x : specials[id].at("ids")) (seen_a ? pp.suffix : pp.prefix).push_back(x.get<int32_t>());
      } else {
        fail(where, ": post_processor TemplateProcessing item is neither Sequence nor SpecialToken");
      }
    }
    return pp;
  }
  fail(where, ": post_processor type '", type, "' is not supported");
}

}  // namespace

void TokenizerImpl::load(const std::string& path, const std::string& config_path) {
  path_ = path;
  BpeTables tables;
  nlohmann::json j = parse_tokenizer_json(read_file_text(path), path, tables);
  try {
    if (!j.is_object()) fail(path, ": not a tokenizer.json object");
    static const nlohmann::json kNull;
    auto field = [&](const char* k) -> const nlohmann::json& { return j.contains(k) ? j[k] : kNull; };
    const nlohmann::json& model = field("model");
    if (!model.is_object()) fail(path, ": no \"model\" object");
    std::string mtype = model.value("type", "BPE");
    if (mtype != "BPE") fail(path, ": model type '", mtype, "' is not supported (only BPE)");

    normalizer_ = Normalizer::from_json(field("normalizer"), path);
    pretok_ = PreTokenizer::from_json(field("pre_tokenizer"), path);
    model_ = BpeModel::from_json(model, pretok_.byte_level(), path, tables);
    post_ = parse_post(field("post_processor"), path);
    decoder_ = Decoder::from_json(field("decoder"), path);

    vocab_size = model_->id_limit();
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const auto& a : j["added_tokens"]) {
        AddedToken t;
        t.id = a.at("id").get<int32_t>();
        t.content = a.at("content").get<std::string>();
        t.special = a.value("special", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        t.normalized = a.value("normalized", !t.special);
        t.single_word = a.value("single_word", false);
        if (t.id < 0) fail(path, ": added token '", t.content, "' has a negative id");
        added_.push_back(std::move(t));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": unexpected structure: ", e.what());
  }
  std::vector<const AddedToken*> raw, norm;
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& t = added_[i];
    added_by_id_[t.id] = i;
    added_by_content_.emplace(t.content, t.id);
    vocab_size = std::max(vocab_size, t.id + 1);
    (t.normalized && !normalizer_.empty() ? norm : raw).push_back(&t);
  }
  raw_matcher_.build(raw);
  norm_matcher_.build(norm);

  bool pieces_ok = pretok_.chunkable() ||
                   (pretok_.empty() && model_->metaspace_cut() && normalizer_.replaces_space_with("\xE2\x96\x81"));
  chunkable_ = normalizer_.chunkable() && !norm_matcher_.any_contains(' ') && pieces_ok;

  // tokenizer_config.json: bos/eos, and Llama-family add_bos_token/add_eos_token which
  // transformers turns into the post-processor.
  if (!config_path.empty()) {
    nlohmann::json c = read_json(config_path);
    if (!c.is_object()) fail(config_path, ": not a JSON object");
    bos_token = token_string(c.value("bos_token", nlohmann::json()));
    eos_token = token_string(c.value("eos_token", nlohmann::json()));
    std::string cls = c.value("tokenizer_class", "");
    static const char* kLlamaLike[] = {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                       "CodeLlamaTokenizerFast", "GemmaTokenizer", "GemmaTokenizerFast"};
    bool llama_like = std::find(std::begin(kLlamaLike), std::end(kLlamaLike), cls) != std::end(kLlamaLike);
    if (llama_like && (c.contains("add_bos_token") || c.contains("add_eos_token"))) {
      bool add_bos = c.value("add_bos_token", true), add_eos = c.value("add_eos_token", false);
      PostProcessor pp;
      if (add_bos) {
        int32_t id = token_to_id(bos_token);
        if (id < 0) fail(config_path, ": add_bos_token is set but bos_token '", bos_token, "' is not in the vocab");
        pp.prefix.push_back(id);
      }
      if (add_eos) {
        int32_t id = token_to_id(eos_token);
        if (id < 0) fail(config_path, ": add_eos_token is set but eos_token '", eos_token, "' is not in the vocab");
        pp.suffix.push_back(id);
      }
      post_ = pp;
    }
  } else if (post_.prefix.size() == 1) {
    bos_token = id_to_token(post_.prefix[0]);
  }
  if (!bos_token.empty() && token_to_id(bos_token) >= 0) bos_id = token_to_id(bos_token);
  if (!eos_token.empty() && token_to_id(eos_token) >= 0) eos_id = token_to_id(eos_token);
}

void TokenizerImpl::add_special(std::vector<int32_t>& ids) const {
  if (!post_.prefix.empty()) ids.insert(ids.begin(), post_.prefix.begin(), post_.prefix.end());
  ids.insert(ids.end(), post_.suffix.begin(), post_.suffix.end());
}

int32_t TokenizerImpl::token_to_id(std::string_view t) const {
  auto it = added_by_content_.find(std::string(t));
  if (it != added_by_content_.end()) return it->second;
  return model_->token_to_id(t);
}

std::string TokenizerImpl::id_to_token(int32_t id) const {
  auto it = added_by_id_.find(id);
  if (it != added_by_id_.end()) return added_[it->second].content;
  return model_->id_to_token(id);
}

bool TokenizerImpl::is_special(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

std::string TokenizerImpl::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    auto it = added_by_id_.find(id);
    if (it != added_by_id_.end()) {
      if (skip_special && added_[it->second].special) continue;
      toks.push_back(added_[it->second].content);
      continue;
    }
    const std::string& t = model_->id_to_token(id);
    if (t.empty()) continue;  // unknown ids are dropped, as in the Rust library
    toks.push_back(t);
  }
  return decoder_.decode(std::move(toks));
}

}  // namespace tok

// ---- public API ----------------------------------------------------------------------------

Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_files(const std::string& tokenizer_json,
                                                 const std::string& tokenizer_config_json) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->impl_ = std::make_unique<tok::TokenizerImpl>();
  t->impl_->load(tokenizer_json, tokenizer_config_json);
  std::vector<int32_t> a;
  t->impl_->encode_text("a", a);
  if (a.size() == 1) {
    t->text_anchor_ = a[0];
    t->text_anchor_text_ = t->impl_->decode(a, false);
  }
  return t;
}

std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path tj = fs::path(dir) / "tokenizer.json";
  if (!fs::exists(tj)) fail(tj.string(), ": not found (the model folder needs a tokenizer.json)");
  fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  return from_files(tj.string(), fs::exists(cfg) ? cfg.string() : std::string());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  impl_->encode_parallel(text, ids, num_threads());
  if (add_special_tokens) impl_->add_special(ids);
  return ids;
}

std::vector<int32_t> Tokenizer::encode_single_thread(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  impl_->encode_text(text, ids);
  if (add_special_tokens) impl_->add_special(ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

std::string Tokenizer::token_text(int32_t id) const {
  if (text_anchor_ < 0) return decode({id});
  std::string s = decode({text_anchor_, id});
  if (s.compare(0, text_anchor_text_.size(), text_anchor_text_) != 0) return decode({id});
  return s.substr(text_anchor_text_.size());
}

int32_t Tokenizer::token_to_id(std::string_view tok) const { return impl_->token_to_id(tok); }
std::string Tokenizer::id_to_token(int32_t id) const { return impl_->id_to_token(id); }
int Tokenizer::vocab_size() const { return impl_->vocab_size; }
bool Tokenizer::is_special(int32_t id) const { return impl_->is_special(id); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }

}  // namespace nf4flash
