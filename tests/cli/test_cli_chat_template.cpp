// `nf4flash chat-template`: prints exactly the rendered text (no trailing newline) and turns
// template errors into one "error: ..." line on stderr with a non-zero exit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nf4flash::test::CliResult;

class ChatCli : public testing::Test {
 protected:
  fs::path write(const std::string& name, const std::string& text) { return dir_.file(name, text); }
  static CliResult run(const std::string& args) { return nf4flash::test::run_cli("chat-template " + args); }

  nf4flash::test::TempDir dir_{"nf4flash_chat_cli"};
};

TEST_F(ChatCli, GoldenCasesExactBytes) {
  std::ifstream in(nf4flash::test::fixture("tokenizer-golden.json"));
  auto golden = nlohmann::ordered_json::parse(in);
  for (const char* model : {"llama3", "qwen3"}) {
    int n = 0;
    for (const auto& c : golden["chat_templates"][model]) {
      fs::path msgs = write("messages.json", c["messages"].dump());
      std::string args = "--model '" + nf4flash::test::fixture(std::string("tokenizers/") + model) + "' --messages '" +
                         msgs.string() + "'";
      if (c["add_generation_prompt"].get<bool>()) args += " --add-generation-prompt";
      CliResult r = run(args);
      EXPECT_EQ(r.code, 0) << r.err;
      EXPECT_EQ(r.out, c["rendered"].get<std::string>()) << model << " case " << n++;
    }
  }
}

TEST_F(ChatCli, TemplateFileWithContext) {
  fs::path tmpl = write("t.jinja", "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}"
                                   "{% if enable_thinking is false %}nothink{% endif %}");
  fs::path msgs = write("m.json", R"([{"role": "user", "content": "hi"}])");
  fs::path ctx = write("ctx.json", R"({"enable_thinking": false})");
  CliResult r = run("--template-file '" + tmpl.string() + "' --bos-token '<s>' --messages '" + msgs.string() +
                    "' --context '" + ctx.string() + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>user:hi\nnothink");
}

TEST_F(ChatCli, ErrorsAreOneLine) {
  fs::path tmpl = write("bad.jinja", "line one\n{{ raise_exception('no system role') }}");
  fs::path msgs = write("m.json", "[]");
  CliResult r = run("--template-file '" + tmpl.string() + "' --messages '" + msgs.string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "error: chat template: line 2:4: raise_exception: no system role\n");

  fs::path bad_msgs = write("bad.json", R"({"role": "user"})");
  r = run("--template-file '" + tmpl.string() + "' --messages '" + bad_msgs.string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--messages"), std::string::npos) << r.err;

  r = run("--model '" + nf4flash::test::fixture("tokenizers/llama2") + "' --messages '" + msgs.string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;
}

}  // namespace
