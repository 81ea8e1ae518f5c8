// Shared helpers for the tokenizer tests: fixture paths, cached tokenizers and the golden cases.
#pragma once
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash::test {

inline std::string tok_dir(const std::string& name) { return fixture("tokenizers/" + name); }

// Loaded once per test binary.
inline const Tokenizer& fixture_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& t = cache[name];
  if (!t) t = Tokenizer::from_dir(tok_dir(name));
  return *t;
}

struct GoldenCase {
  std::string text;
  std::vector<int32_t> ids, ids_with_special;
  std::string decoded;
};

inline const std::vector<GoldenCase>& golden_cases(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::vector<GoldenCase>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  std::ifstream in(fixture("tokenizer-golden.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<GoldenCase> cases;
  for (const auto& c : j.at("tokenizers").at(name)) {
    cases.push_back({c.at("text").get<std::string>(), c.at("ids").get<std::vector<int32_t>>(),
                     c.at("ids_with_special").get<std::vector<int32_t>>(), c.at("decoded").get<std::string>()});
  }
  return cache[name] = std::move(cases);
}

}  // namespace nf4flash::test
