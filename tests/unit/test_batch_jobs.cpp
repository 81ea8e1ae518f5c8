// The batch run's files: every field of an input line parsed and checked (each bad value one error
// naming the field), duplicate ids and bad lines reported with their line numbers, the ids already
// done in a result file (a cut last line not counted), and the writer that appends whole lines,
// cutting a partial last line first.
#include <gtest/gtest.h>

#include <fstream>

#include "batch/batch_jobs.h"
#include "core/error.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

std::string error_of(const std::string& line) {
  try {
    parse_batch_job(line, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BatchJobs, ParsesEveryField) {
  const BatchJob b = parse_batch_job(
      R"({"id": "a1", "prompt": "Hi", "max_new_tokens": 0, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
          "min_p": 0.05, "seed": 7, "stop": ["\n\n", "END"]})",
      3);
  EXPECT_EQ(b.id, "a1");
  EXPECT_EQ(b.line, 3);
  EXPECT_EQ(*b.prompt, "Hi");
  EXPECT_EQ(*b.max_new_tokens, 0);
  EXPECT_FLOAT_EQ(*b.temperature, 0.7f);
  EXPECT_FLOAT_EQ(*b.top_p, 0.9f);
  EXPECT_EQ(*b.top_k, 40);
  EXPECT_FLOAT_EQ(*b.min_p, 0.05f);
  EXPECT_EQ(*b.seed, 7u);
  EXPECT_EQ(b.stop, (std::vector<std::string>{"\n\n", "END"}));
  const BatchJob m = parse_batch_job(R"({"id": 12, "messages": [{"role": "user", "content": "x"}], "stop": "."})", 1);
  EXPECT_EQ(m.id, "12");
  EXPECT_FALSE(m.prompt);
  EXPECT_EQ(m.messages.size(), 1u);
  EXPECT_EQ(m.stop, std::vector<std::string>{"."});
  EXPECT_FALSE(m.max_new_tokens || m.temperature || m.seed);  // unset: the run's defaults apply
}

TEST(BatchJobs, EachBadValueIsAnErrorNamingTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"(not json)", "not valid JSON"},
      {R"([1, 2])", "JSON object"},
      {R"({"prompt": "x"})", "missing \"id\""},
      {R"({"id": "", "prompt": "x"})", "\"id\""},
      {R"({"id": 1.5, "prompt": "x"})", "\"id\""},
      {R"({"id": "a"})", "missing \"prompt\""},
      {R"({"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "y"}]})", "not both"},
      {R"({"id": "a", "prompt": 3})", "\"prompt\" must be a string"},
      {R"({"id": "a", "messages": []})", "\"messages\""},
      {R"({"id": "a", "messages": [{"role": "user"}]})", "\"messages\"[0]"},
      {R"({"id": "a", "prompt": "x", "max_new_tokens": -1})", "\"max_new_tokens\""},
      {R"({"id": "a", "prompt": "x", "max_new_tokens": 2.5})", "\"max_new_tokens\" must be an integer"},
      {R"({"id": "a", "prompt": "x", "temperature": "hot"})", "\"temperature\" must be a number"},
      {R"({"id": "a", "prompt": "x", "temperature": -0.1})", "\"temperature\""},
      {R"({"id": "a", "prompt": "x", "top_p": 0})", "\"top_p\""},
      {R"({"id": "a", "prompt": "x", "top_p": 1.5})", "\"top_p\""},
      {R"({"id": "a", "prompt": "x", "min_p": 2})", "\"min_p\""},
      {R"({"id": "a", "prompt": "x", "top_k": -3})", "\"top_k\""},
      {R"({"id": "a", "prompt": "x", "seed": -1})", "\"seed\""},
      {R"({"id": "a", "prompt": "x", "stop": ""})", "\"stop\""},
      {R"({"id": "a", "prompt": "x", "stop": [1]})", "\"stop\""},
      {R"({"id": "a", "prompt": "x", "stop": {"a": 1}})", "\"stop\""},
      {R"({"id": "a", "prompt": "x", "max_tokens": 5})", "unknown field \"max_tokens\""},
  };
  for (auto [line, want] : cases) {
    const std::string e = error_of(line);
    EXPECT_NE(e.find(want), std::string::npos) << line << " -> '" << e << "'";
  }
  std::string many = R"({"id": "a", "prompt": "x", "stop": [)";
  for (int i = 0; i <= kMaxStops; ++i) many += std::string(i ? "," : "") + "\"s" + std::to_string(i) + "\"";
  EXPECT_NE(error_of(many + "]}").find("at most"), std::string::npos);
}

TEST(BatchJobs, FileReportsBadLinesAndDuplicateIdsByLineNumber) {
  TempDir dir("nf4flash_batch");
  const auto in = dir.file("in.jsonl",
                           "{\"id\": \"a\", \"prompt\": \"one\"}\n"
                           "\n"
                           "{\"id\": \"b\", \"prompt\": 2}\r\n"
                           "{\"id\": \"a\", \"prompt\": \"again\"}\n"
                           "{\"id\": \"c\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}");  // no final newline
  const BatchJobFile f = read_batch_jobs(in.string());
  ASSERT_EQ(f.jobs.size(), 2u);
  EXPECT_EQ(f.jobs[0].id, "a");
  EXPECT_EQ(f.jobs[1].id, "c");
  EXPECT_EQ(f.jobs[1].line, 5);
  ASSERT_EQ(f.errors.size(), 2u);
  EXPECT_EQ(f.errors[0].line, 3);
  EXPECT_NE(f.errors[0].message.find("\"prompt\""), std::string::npos);
  EXPECT_EQ(f.errors[1].line, 4);
  EXPECT_NE(f.errors[1].message.find("earlier line"), std::string::npos);
  EXPECT_THROW(read_batch_jobs((dir.path / "missing.jsonl").string()), Error);
}

TEST(BatchJobs, WriterAppendsWholeLinesAndResumeSkipsDoneIds) {
  TempDir dir("nf4flash_batch");
  const std::string out = dir / "out.jsonl";
  EXPECT_TRUE(read_done_ids(out).empty());  // no file yet
  {
    BatchResultWriter w(out);
    w.write({"a", "hello", 3, 5, "stop", ""});
    w.write({"b", "", 0, 2, "length", ""});
    w.write({"e", "", 0, 0, "", "prompt too long"});
  }
  EXPECT_EQ(read_done_ids(out), (std::set<std::string>{"a", "b", "e"}));
  // an interrupted run leaves a partial line: it is not done, and the next writer cuts it
  std::ofstream(out, std::ios::app | std::ios::binary) << R"({"id": "c", "text": "cut sh)";
  EXPECT_EQ(read_done_ids(out).count("c"), 0u);
  {
    BatchResultWriter w(out);
    w.write({"c", "whole \xff", 2, 4, "stop", ""});  // invalid UTF-8 is replaced, not an error
  }
  const std::string all = slurp(out);
  EXPECT_EQ(count_lines(all), 4);
  EXPECT_EQ(all.find("cut sh"), std::string::npos);
  EXPECT_EQ(read_done_ids(out), (std::set<std::string>{"a", "b", "c", "e"}));
  std::ifstream in(out);
  std::string line;
  std::getline(in, line);
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j, (nlohmann::json{{"id", "a"}, {"text", "hello"}, {"completion_tokens", 3}, {"prompt_tokens", 5},
                               {"finish_reason", "stop"}}));
}

}  // namespace
