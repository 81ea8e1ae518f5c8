// Chat templates against transformers: every case in tokenizer-golden.json `chat_templates`
// (llama3, qwen3) must render byte for byte like apply_chat_template(tokenize=False).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "core/error.h"
#include "test_util.h"

namespace {

using nf4flash::test::fixture;

nlohmann::ordered_json read_json(const std::string& path) {
  EXPECT_TRUE(std::filesystem::is_regular_file(path)) << path;
  return nlohmann::ordered_json::parse(nf4flash::test::slurp(path));
}

void check_model(const std::string& model) {
  auto golden = read_json(fixture("tokenizer-golden.json"));
  const auto& cases = golden.at("chat_templates").at(model);
  ASSERT_FALSE(cases.empty());
  auto tmpl = nf4flash::ChatTemplate::from_tokenizer_config(fixture("tokenizers/" + model + "/tokenizer_config.json"));
  int n = 0;
  for (const auto& c : cases) {
    std::string want = c.at("rendered").get<std::string>();
    std::string got = tmpl.apply(c.at("messages"), c.at("add_generation_prompt").get<bool>());
    EXPECT_EQ(got, want) << model << " case " << n;
    // Rendering again from the same parsed template gives the same text.
    EXPECT_EQ(tmpl.apply(c.at("messages"), c.at("add_generation_prompt").get<bool>()), got);
    ++n;
  }
}

TEST(ChatGolden, Llama3) { check_model("llama3"); }
TEST(ChatGolden, Qwen3) { check_model("qwen3"); }

TEST(ChatGolden, Qwen3ToolsAndThinking) {
  // Exercises the tool, tool_call, tool-response and reasoning branches of the real Qwen3
  // template; expected text checked against jinja2 with transformers' environment settings.
  auto tmpl = nf4flash::ChatTemplate::from_tokenizer_config(fixture("tokenizers/qwen3/tokenizer_config.json"));
  auto messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "<think>\nNeed the tool.\n</think>\n\nChecking.", "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 1.5, "ok": true, "x": null}}},
      {"type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}}]},
    {"role": "tool", "content": "{\"temp\": 20}"},
    {"role": "tool", "content": "12:00"},
    {"role": "assistant", "content": "20C at noon."}
  ])");
  auto extra = nlohmann::ordered_json::parse(R"({"enable_thinking": false, "tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "Météo \"now\"",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]})");
  std::string want =
      "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
      "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
      "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Météo \\\"now\\\"\", "
      "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
      "[\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
      "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": "
      "\"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": 1.5, \"ok\": true, \"x\": null}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call><|im_end|>\n"
      "<|im_start|>user\n<tool_response>\n{\"temp\": 20}\n</tool_response>\n<tool_response>\n12:00\n"
      "</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n20C at noon.<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(tmpl.apply(messages, true, extra), want);
}

TEST(ChatGolden, ConfigErrors) {
  EXPECT_THROW(nf4flash::ChatTemplate::from_tokenizer_config("/nonexistent/tokenizer_config.json"), nf4flash::Error);
  auto tmpl = nf4flash::ChatTemplate::from_tokenizer_config(fixture("tokenizers/qwen3/tokenizer_config.json"));
  EXPECT_EQ(tmpl.eos_token(), "<|im_end|>");
  EXPECT_EQ(tmpl.bos_token(), "");
  EXPECT_THROW(tmpl.apply(nlohmann::json::object(), false), nf4flash::Error);
}

}  // namespace
