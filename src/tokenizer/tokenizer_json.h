// tokenizer.json read in one streaming pass (nlohmann's SAX parser): the BPE vocab and merges
// (model.vocab, model.merges: about 99% of the file, ~400k strings for Llama 3) go straight into
// flat lists instead of a JSON document of one std::map node per entry; everything else becomes
// a small nlohmann::json document, where model.vocab and model.merges are left empty.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace nf4flash::tok {

struct BpeTables {
  bool has_vocab = false, has_merges = false;  // present in the file as an object / an array
  std::vector<std::pair<std::string, int64_t>> vocab;       // in file order
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
};

// Parses the text of tokenizer.json at `path` (named in errors). A model.vocab entry that is not an
// integer and a model.merges entry that is neither "a b" nor ["a", "b"] are errors here.
nlohmann::json parse_tokenizer_json(const std::string& text, const std::string& path, BpeTables& tables);

}  // namespace nf4flash::tok
