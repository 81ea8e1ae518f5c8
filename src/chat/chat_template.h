// Chat templates: renders a model's tokenizer_config.json `chat_template` (a Jinja2 subset, see
// parser.h/eval.h/builtins.h) the way transformers' apply_chat_template does (trim_blocks,
// lstrip_blocks, json.dumps-style tojson, raise_exception, strftime_now). Parse once, render many.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace nf4flash {

namespace chat {
struct Stmt;
}

class ChatTemplate {
 public:
  // Template source, plus bos_token/eos_token strings from tokenizer_config.json (an empty string
  // leaves the variable undefined, as transformers does for a missing special token).
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Reads "chat_template" (a string, or a list of {name, template}: takes "default"), and
  // bos_token/eos_token (a string or an {"content": ...} object).
  static ChatTemplate from_tokenizer_config(const std::string& tokenizer_config_json_path);
  // A model folder: the template from tokenizer_config.json, else from chat_template.jinja or
  // chat_template.json (where newer transformers save it); tokens from tokenizer_config.json.
  static ChatTemplate from_model_dir(const std::string& model_dir);

  // messages: a JSON list of {role, content, ...}. extra_context: an object whose keys become
  // template variables (tools, documents, enable_thinking, ...); tools/documents default to none.
  // Prefer nlohmann::ordered_json so tojson keeps the caller's key order (as Python does).
  std::string apply(const nlohmann::json& messages, bool add_generation_prompt,
                    const nlohmann::json& extra_context = {}) const;
  std::string apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                    const nlohmann::ordered_json& extra_context = {}) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  struct Impl;
  std::string source_, bos_token_, eos_token_;
  std::unique_ptr<Impl> impl_;

  template <typename Json>
  std::string apply_impl(const Json& messages, bool add_generation_prompt, const Json& extra_context) const;
};

}  // namespace nf4flash
