// Request bodies of `nf4flash serve` (serve/openai_request.h): what OpenAI clients send parses into
// the generation parameters; every malformed body, wrong type, out-of-range value and unknown field
// is one 400 naming the field; merged_sampling keeps the server defaults for unset fields.
#include <gtest/gtest.h>

#include "serve/openai_request.h"

namespace nf4flash::serve {
namespace {

TEST(ServeRequest, ChatFieldsParse) {
  const ParseResult r = parse_gen_request(R"({"model": "m", "messages": [{"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null}, {"role": "developer", "content": "x"}],
      "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3,
      "stop": ["\n", "END"], "stream": true, "stream_options": {"include_usage": true}, "n": 2,
      "repetition_penalty": 1.1, "presence_penalty": 0, "user": "u1"})",
                                          Endpoint::Chat);
  ASSERT_FALSE(r.error) << r.error->message;
  const GenRequest& g = *r.request;
  EXPECT_EQ(g.model, "m");
  ASSERT_EQ(g.messages.size(), 4u);
  EXPECT_EQ(g.messages[1]["content"], "hi there");
  EXPECT_EQ(g.messages[2]["content"], "");
  EXPECT_EQ(g.messages[3]["role"], "system");
  EXPECT_EQ(*g.max_tokens, 7);
  EXPECT_FLOAT_EQ(*g.temperature, 0.5f);
  EXPECT_EQ(*g.top_k, 40);
  EXPECT_EQ(*g.seed, 3u);
  EXPECT_EQ(g.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(g.stream && g.include_usage);
  EXPECT_EQ(g.n, 2);
  SamplingParams d;
  d.temperature = 0.7f;
  d.min_p = 0.2f;
  const SamplingParams s = merged_sampling(g, d);
  EXPECT_FLOAT_EQ(s.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.repeat_penalty, 1.1f);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  const ParseResult plain = parse_gen_request(R"({"messages": [{"role": "user", "content": "x"}]})", Endpoint::Chat);
  ASSERT_FALSE(plain.error);
  EXPECT_FLOAT_EQ(merged_sampling(*plain.request, d).temperature, 0.7f);  // unset: the server's default
  EXPECT_FALSE(plain.request->max_tokens);
}

TEST(ServeRequest, CompletionPromptForms) {
  auto p = [](const char* body) { return parse_gen_request(body, Endpoint::Completion); };
  EXPECT_EQ(*p(R"({"prompt": "hello"})").request->prompt, "hello");
  EXPECT_EQ(*p(R"({"prompt": ["hello"]})").request->prompt, "hello");
  EXPECT_EQ(p(R"({"prompt": [1, 2, 3], "logprobs": null})").request->prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*p(R"({"prompt": "x", "max_tokens": 5.0})").request->max_tokens, 5);  // Python clients send floats
}

TEST(ServeRequest, EveryBadBodyIsOneErrorNamingTheField) {
  const std::pair<const char*, const char*> chat[] = {
      {"{", ""},
      {"[]", ""},
      {R"({"messages": [5002153233355E5555555]})", ""},  // a number past double: not valid JSON here
      {R"({})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": [1]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0].type"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "messages[0].tool_calls"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", "top_p"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_k": 1.5})", "top_k"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "max_completion_tokens": 6})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 17})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ""})", "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", "stop[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5})", "presence_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temprature": 0.5})", "temprature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0})", "repetition_penalty"},
  };
  for (const auto& [body, param] : chat) {
    const ParseResult r = parse_gen_request(body, Endpoint::Chat);
    ASSERT_TRUE(r.error) << body;
    EXPECT_EQ(r.error->status, 400) << body;
    EXPECT_EQ(r.error->param, param) << body << ": " << r.error->message;
    EXPECT_FALSE(r.error->message.empty());
    const nlohmann::json j = r.error->to_json();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
  for (const char* body : {R"({"max_tokens": 3})", R"({"prompt": ""})", R"({"prompt": {}})", R"({"prompt": [1, -2]})",
                           R"({"prompt": "x", "echo": true})", R"({"prompt": "x", "messages": []})"}) {
    const ParseResult r = parse_gen_request(body, Endpoint::Completion);
    EXPECT_TRUE(r.error) << body;
  }
}

// A body whose bytes are not UTF-8 is echoed in the error message; the reply is still JSON text.
TEST(ServeRequest, ErrorsEchoingBadBytesStayJson) {
  for (const std::string body : {std::string("{\"messages\": [\xff"), std::string("{\"\xff\xfe\": 1}")}) {
    const ParseResult r = parse_gen_request(body, Endpoint::Chat);
    ASSERT_TRUE(r.error);
    EXPECT_ANY_THROW((void)r.error->to_json().dump());  // the message does hold the bytes
    std::string text;
    EXPECT_NO_THROW(text = json_text(r.error->to_json())) << r.error->message;
    EXPECT_NO_THROW((void)nlohmann::json::parse(text));
  }
}

TEST(ServeRequest, TokenizeBodies) {
  TokenizeRequest t;
  EXPECT_FALSE(parse_tokenize(R"({"content": "hi", "add_special": false})", &t));
  EXPECT_EQ(t.content, "hi");
  EXPECT_FALSE(t.add_special);
  EXPECT_TRUE(parse_tokenize(R"({"text": "hi"})", &t));
  std::vector<int32_t> ids;
  EXPECT_FALSE(parse_detokenize(R"({"tokens": [5, 6]})", &ids));
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 6}));
  ids.clear();
  EXPECT_TRUE(parse_detokenize(R"({"tokens": ["a"]})", &ids));
  EXPECT_TRUE(parse_detokenize("nope", &ids));
}

}  // namespace
}  // namespace nf4flash::serve
