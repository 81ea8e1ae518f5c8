// nf4flash chat-template: render a messages JSON file through a model's chat template and print
// the text exactly as transformers' apply_chat_template(tokenize=False) would, with nothing appended.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "commands.h"
#include "core/error.h"

namespace nf4flash::cli {
namespace {

struct ChatTemplateArgs {
  std::string model_dir, tokenizer_config, template_file, messages, context;
  std::string bos_token, eos_token;
  bool add_generation_prompt = false;
};

nlohmann::ordered_json read_json_file(const std::string& path, const char* flag) {
  std::string text = read_text_file(path);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(flag, " ", path, ": invalid JSON: ", e.what());
  }
}

int run_chat_template(const ChatTemplateArgs& a) {
  std::unique_ptr<ChatTemplate> tmpl;
  if (!a.template_file.empty()) {
    try {
      tmpl = std::make_unique<ChatTemplate>(read_text_file(a.template_file), a.bos_token, a.eos_token);
    } catch (const Error& e) {
      fail(a.template_file, ": ", e.what());
    }
  } else if (!a.tokenizer_config.empty()) {
    tmpl = std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer_config(a.tokenizer_config));
  } else {
    tmpl = std::make_unique<ChatTemplate>(ChatTemplate::from_model_dir(a.model_dir));
  }
  nlohmann::ordered_json messages = read_json_file(a.messages, "--messages");
  if (messages.is_object() && messages.contains("messages")) messages = messages["messages"];
  if (!messages.is_array()) fail("--messages ", a.messages, ": expected a JSON list of {\"role\", \"content\"} objects");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (!a.context.empty()) {
    context = read_json_file(a.context, "--context");
    if (!context.is_object()) fail("--context ", a.context, ": expected a JSON object of template variables");
  }
  std::string text = tmpl->apply(messages, a.add_generation_prompt, context);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return 0;
}

NF4FLASH_COMMAND("chat-template", "Render a messages JSON file through the model's chat template",
                 [](CLI::App& app) -> CommandRun {
                   auto a = std::make_shared<ChatTemplateArgs>();
                   auto* g = app.add_option_group("template", "where the chat template comes from (one of)");
                   g->add_option("--model", a->model_dir, "model folder (tokenizer_config.json or chat_template.jinja)");
                   g->add_option("--tokenizer-config", a->tokenizer_config, "a tokenizer_config.json file");
                   g->add_option("--template-file", a->template_file, "a Jinja template file");
                   g->require_option(1);
                   app.add_option("--messages", a->messages, "JSON file: a list of {role, content, ...} messages")
                       ->required();
                   app.add_flag("--add-generation-prompt", a->add_generation_prompt,
                                "end with the header that starts the assistant's reply");
                   app.add_option("--context", a->context,
                                  "JSON file: an object of extra template variables (tools, enable_thinking, ...)");
                   app.add_option("--bos-token", a->bos_token, "with --template-file: the bos_token string");
                   app.add_option("--eos-token", a->eos_token, "with --template-file: the eos_token string");
                   return [a] { return run_chat_template(*a); };
                 });

}  // namespace
}  // namespace nf4flash::cli
