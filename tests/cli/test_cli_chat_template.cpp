// `nf4flash chat-template`: prints exactly the rendered text (no trailing newline) and turns
// template errors into one "error: ..." line on stderr with a non-zero exit.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct RunResult {
  int status = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ChatCli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("nf4flash_chat_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

  RunResult run(const std::string& args) {
    RunResult r;
    fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    std::string cmd = std::string("'") + NF4FLASH_BIN + "' chat-template " + args + " >'" + out.string() + "' 2>'" +
                      err.string() + "'";
    int st = std::system(cmd.c_str());
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  fs::path dir_;
};

TEST_F(ChatCli, GoldenCasesExactBytes) {
  std::ifstream in(std::string(NF4FLASH_FIXTURES_DIR) + "/tokenizer-golden.json");
  auto golden = nlohmann::ordered_json::parse(in);
  for (const char* model : {"llama3", "qwen3"}) {
    int n = 0;
    for (const auto& c : golden["chat_templates"][model]) {
      fs::path msgs = write("messages.json", c["messages"].dump());
      std::string args = std::string("--model '") + NF4FLASH_FIXTURES_DIR + "/tokenizers/" + model + "' --messages '" +
                         msgs.string() + "'";
      if (c["add_generation_prompt"].get<bool>()) args += " --add-generation-prompt";
      RunResult r = run(args);
      EXPECT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(r.out, c["rendered"].get<std::string>()) << model << " case " << n++;
    }
  }
}

TEST_F(ChatCli, TemplateFileWithContext) {
  fs::path tmpl = write("t.jinja", "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}"
                                   "{% if enable_thinking is false %}nothink{% endif %}");
  fs::path msgs = write("m.json", R"([{"role": "user", "content": "hi"}])");
  fs::path ctx = write("ctx.json", R"({"enable_thinking": false})");
  RunResult r = run("--template-file '" + tmpl.string() + "' --bos-token '<s>' --messages '" + msgs.string() +
                    "' --context '" + ctx.string() + "'");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "<s>user:hi\nnothink");
}

TEST_F(ChatCli, ErrorsAreOneLine) {
  fs::path tmpl = write("bad.jinja", "line one\n{{ raise_exception('no system role') }}");
  fs::path msgs = write("m.json", "[]");
  RunResult r = run("--template-file '" + tmpl.string() + "' --messages '" + msgs.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "error: chat template: line 2:4: raise_exception: no system role\n");

  fs::path bad_msgs = write("bad.json", R"({"role": "user"})");
  r = run("--template-file '" + tmpl.string() + "' --messages '" + bad_msgs.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--messages"), std::string::npos) << r.err;

  r = run(std::string("--model '") + NF4FLASH_FIXTURES_DIR + "/tokenizers/llama2' --messages '" + msgs.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;
}

}  // namespace
