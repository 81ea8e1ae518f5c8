// Chat templates users commonly meet beyond the golden llama3/qwen3 ones: Mistral (v0.2 classic and
// v0.3 with tools), Gemma 2 and ChatML. Expected texts follow from Jinja semantics with
// transformers' settings (trim_blocks, lstrip_blocks) and were cross-checked against jinja2.
// An expected text starting with "ERROR:" means the template must raise_exception with that message.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "core/error.h"

namespace {

struct ModelCase {
  const char* name;
  const char* tmpl;
  const char* bos;
  const char* eos;
  const char* messages;  // JSON
  bool add_generation_prompt;
  const char* context;   // JSON object of extra variables
  const char* expected;
};

// Template sources as published in the models' tokenizer_config.json "chat_template".
// mistralai/Mistral-7B-Instruct-v0.1/v0.2 (original template)
const char* const kMistralV02 = R"TPL({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})TPL";

// google/gemma-2-*-it
const char* const kGemma2 = R"TPL({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %})TPL";

// ChatML as in Qwen/Qwen2-*-Instruct
const char* const kChatml = R"TPL({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})TPL";

// mistralai/Mistral-7B-Instruct-v0.3 (tools)
const char* const kMistralV03 = R"TPL({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)TPL";

const ModelCase kModelCases[] = {
    {"MistralV02", kMistralV02, "<s>", "</s>",
     "[{\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"assistant\", \"content\": \"  Hello!  \"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}]",
     false, "{}",
     "<s>[INST] Hi there [/INST]  Hello!  </s>[INST] Tell me a joke. [/INST]"},
    {"MistralV02Alternation", kMistralV02, "<s>", "</s>",
     "[{\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"user\", \"content\": \"Hi there\"}]",
     false, "{}",
     "ERROR:Conversation roles must alternate user/assistant/user/assistant/..."},
    {"MistralV02System", kMistralV02, "<s>", "</s>",
     "[{\"role\": \"system\", \"content\": \"You are terse.\"}, {\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"assistant\", \"content\": \"  Hello!  \"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}]",
     false, "{}",
     "ERROR:Conversation roles must alternate user/assistant/user/assistant/..."},
    {"Gemma2", kGemma2, "<bos>", "<eos>",
     "[{\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"assistant\", \"content\": \"  Hello!  \"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}]",
     true, "{}",
     "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nTell me a joke.<end_of_turn>\n<start_of_turn>model\n"},
    {"Gemma2NoGenPrompt", kGemma2, "<bos>", "<eos>",
     "[{\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"assistant\", \"content\": \"  Hello!  \"}]",
     false, "{}",
     "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"},
    {"Gemma2System", kGemma2, "<bos>", "<eos>",
     "[{\"role\": \"system\", \"content\": \"You are terse.\"}, {\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"assistant\", \"content\": \"  Hello!  \"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}]",
     true, "{}",
     "ERROR:System role not supported"},
    {"ChatMLDefaultSystem", kChatml, "<s>", "</s>",
     "[{\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"assistant\", \"content\": \"  Hello!  \"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}]",
     true, "{}",
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n  Hello!  <|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n"},
    {"ChatMLSystem", kChatml, "<s>", "</s>",
     "[{\"role\": \"system\", \"content\": \"You are terse.\"}, {\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"assistant\", \"content\": \"  Hello!  \"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}]",
     false, "{}",
     "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n  Hello!  <|im_end|>\n<|im_start|>user\nTell me a joke.<|im_end|>\n"},
    {"MistralV03System", kMistralV03, "<s>", "</s>",
     "[{\"role\": \"system\", \"content\": \"You are terse.\"}, {\"role\": \"user\", \"content\": \"Hi there\"}, {\"role\": \"assistant\", \"content\": \"  Hello!  \"}, {\"role\": \"user\", \"content\": \"Tell me a joke.\"}]",
     false, "{}",
     "<s>[INST] Hi there[/INST] Hello!</s>[INST] You are terse.\n\nTell me a joke.[/INST]"},
    {"MistralV03Tools", kMistralV03, "<s>", "</s>",
     "[{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"abcDEF123\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"abcDEF123\", \"content\": \"22\"}, {\"role\": \"assistant\", \"content\": \"It is 22C.\"}, {\"role\": \"user\", \"content\": \"Thanks\"}]",
     false, "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]}",
     "<s>[INST] Weather in Paris?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcDEF123\"}]</s>[TOOL_RESULTS] {\"content\": 22, \"call_id\": \"abcDEF123\"}[/TOOL_RESULTS] It is 22C.</s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}][/AVAILABLE_TOOLS][INST] Thanks[/INST]"},
    {"MistralV03BadToolId", kMistralV03, "<s>", "</s>",
     "[{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"x\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}]",
     false, "{}",
     "ERROR:Tool call IDs should be alphanumeric strings with length 9!"},
};

class ChatModels : public testing::TestWithParam<ModelCase> {};

TEST_P(ChatModels, Renders) {
  const ModelCase& c = GetParam();
  nf4flash::ChatTemplate t(c.tmpl, c.bos, c.eos);
  auto messages = nlohmann::ordered_json::parse(c.messages);
  auto context = nlohmann::ordered_json::parse(c.context);
  std::string expected = c.expected;
  if (expected.rfind("ERROR:", 0) == 0) {
    try {
      t.apply(messages, c.add_generation_prompt, context);
      FAIL() << "expected raise_exception: " << expected;
    } catch (const nf4flash::Error& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("raise_exception: " + expected.substr(6)), std::string::npos) << what;
      EXPECT_EQ(what.rfind("chat template: line ", 0), 0u) << what;
    }
  } else {
    EXPECT_EQ(t.apply(messages, c.add_generation_prompt, context), expected);
  }
}

INSTANTIATE_TEST_SUITE_P(ChatModelCases, ChatModels, testing::ValuesIn(kModelCases),
                         [](const testing::TestParamInfo<ModelCase>& i) { return std::string(i.param.name); });

}  // namespace
