// Chat-template front end (see chat_template.h): tokenizer_config.json reading and render context.
#include "chat/chat_template.h"

#include <fstream>
#include <sstream>

#include "chat/eval.h"
#include "chat/parser.h"
#include "core/error.h"

namespace nf4flash {

struct ChatTemplate::Impl {
  chat::Body body;
};

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)),
      impl_(std::make_unique<Impl>()) {
  impl_->body = chat::parse_template(source_);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

namespace {

std::string token_string(const nlohmann::ordered_json& cfg, const char* key, const std::string& path) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  fail(path, ": '", key, "' must be a string or an object with a string 'content'");
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  out = ss.str();
  return true;
}

nlohmann::ordered_json read_config(const std::string& path) {
  std::string text;
  if (!read_file(path, text)) fail(path, ": cannot open");
  nlohmann::ordered_json cfg;
  try {
    cfg = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
  if (!cfg.is_object()) fail(path, ": expected a JSON object");
  return cfg;
}

// The template from a "chat_template" entry: a string, or a list of {name, template}.
std::string template_source(const nlohmann::ordered_json& entry, const std::string& path) {
  std::string source;
  const auto* it = &entry;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    bool found = false;
    for (const auto& e : *it) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string()) {
        source = e["template"].get<std::string>();
        found = true;
        break;
      }
    }
    if (!found) fail(path, ": 'chat_template' is a list without a template named 'default'");
  } else {
    fail(path, ": 'chat_template' must be a string or a list of {name, template}");
  }
  return source;
}

}  // namespace

ChatTemplate ChatTemplate::from_tokenizer_config(const std::string& path) {
  nlohmann::ordered_json cfg = read_config(path);
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) fail(path, ": no 'chat_template' (this tokenizer has no chat template)");
  std::string source = template_source(*it, path);
  try {
    return ChatTemplate(std::move(source), token_string(cfg, "bos_token", path), token_string(cfg, "eos_token", path));
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  const std::string cfg_path = dir + "/tokenizer_config.json";
  nlohmann::ordered_json cfg = read_config(cfg_path);
  auto it = cfg.find("chat_template");
  if (it != cfg.end() && !it->is_null()) return from_tokenizer_config(cfg_path);
  std::string source, where = dir + "/chat_template.jinja";
  if (!read_file(where, source)) {
    where = dir + "/chat_template.json";
    std::string text;
    if (!read_file(where, text))
      fail(dir, ": no chat template (none in tokenizer_config.json, no chat_template.jinja or chat_template.json)");
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail(where, ": invalid JSON: ", e.what());
    }
    if (!j.is_object() || !j.contains("chat_template")) fail(where, ": no 'chat_template'");
    source = template_source(j["chat_template"], where);
  }
  try {
    return ChatTemplate(std::move(source), token_string(cfg, "bos_token", cfg_path), token_string(cfg, "eos_token", cfg_path));
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
}

template <typename Json>
std::string ChatTemplate::apply_impl(const Json& messages, bool add_generation_prompt,
                                     const Json& extra_context) const {
  if (!messages.is_array()) fail("chat template: messages must be a JSON list of {role, content} objects");
  if (!extra_context.is_null() && !extra_context.is_object())
    fail("chat template: extra context must be a JSON object");
  chat::ValueDict ctx;
  ctx.set("messages", chat::from_json(messages));
  ctx.set("add_generation_prompt", chat::Value::boolean(add_generation_prompt));
  ctx.set("tools", chat::Value::none());
  ctx.set("documents", chat::Value::none());
  if (!bos_token_.empty()) ctx.set("bos_token", chat::Value::string(bos_token_));
  if (!eos_token_.empty()) ctx.set("eos_token", chat::Value::string(eos_token_));
  if (extra_context.is_object())
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) ctx.set(it.key(), chat::from_json(it.value()));
  chat::Evaluator ev(std::move(ctx));
  return ev.render(impl_->body);
}

std::string ChatTemplate::apply(const nlohmann::json& messages, bool add_generation_prompt,
                                const nlohmann::json& extra_context) const {
  return apply_impl(messages, add_generation_prompt, extra_context);
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra_context) const {
  return apply_impl(messages, add_generation_prompt, extra_context);
}

}  // namespace nf4flash
