// parse_tokenizer_json (tokenizer_json.h): a SAX handler that builds the document as nlohmann's own
// DOM parser does, except inside model.vocab and model.merges.
#include "tokenizer/tokenizer_json.h"

#include "core/error.h"

namespace nf4flash::tok {
namespace {

using json = nlohmann::json;

class Handler final : public nlohmann::json_sax<json> {
 public:
  // text_size: the file's bytes, from which the vocab and merges lists are reserved (an entry takes
  // at least ~24 bytes of JSON as a merge, ~48 as a vocab entry in real files), so that they never
  // grow by copying (for Llama 3 that copying and its page faults were a third of the load)
  Handler(const std::string& path, BpeTables& t, size_t text_size) : path_(path), t_(t), text_size_(text_size) {}
  json root;

  bool null() override { return value(nullptr, "null"); }
  bool boolean(bool v) override { return value(v, "a boolean"); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::Vocab) return vocab_id(v);
    return value(v, "a number");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::Vocab) return vocab_id(v > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(v));
    return value(v, "a number");
  }
  bool number_float(number_float_t v, const string_t&) override { return value(v, "a number"); }
  bool string(string_t& v) override {
    if (mode_ == Mode::Merges) {
      const size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        fail(path_, ": model.merges entry ", t_.merges.size(), " ('", v, "') is not two tokens separated by a space");
      t_.merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    if (mode_ == Mode::MergePair) {
      if (pair_n_ >= 2) bad_merge();
      pair_[pair_n_++] = std::move(v);
      return true;
    }
    return value(std::move(v), "a string");
  }
  bool binary(binary_t&) override { fail(path_, ": binary values are not JSON"); }

  // model.vocab / model.merges begins: its place in the document stays empty, its entries go to
  // the tables (reserved from the file size)
  template <typename List, typename M>  // M: Mode, declared below
  bool enter_table(json empty, bool& has, List& list, size_t reserve, M m) {
    *slot_ = std::move(empty);
    has = true;
    list.clear();
    list.reserve(reserve);
    mode_ = m;
    pending_ = Pending::None;
    return true;
  }

  bool start_object(std::size_t) override {
    if (mode_ == Mode::Merges || mode_ == Mode::MergePair) bad_merge();
    if (mode_ == Mode::Vocab) bad_vocab();
    if (pending_ == Pending::Vocab) return enter_table(json::object(), t_.has_vocab, t_.vocab, text_size_ / 48, Mode::Vocab);
    pending_ = Pending::None;
    stack_.push_back(place(json(json::value_t::object)));
    return true;
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::Vocab) {
      vkey_ = std::move(k);
      return true;
    }
    if (stack_.size() == 1) top_key_ = k;
    pending_ = stack_.size() == 2 && top_key_ == "model" ? (k == "vocab" ? Pending::Vocab : k == "merges" ? Pending::Merges : Pending::None)
                                                        : Pending::None;
    slot_ = &(*stack_.back())[k];
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::Vocab) {
      mode_ = Mode::Normal;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::Vocab) bad_vocab();
    if (mode_ == Mode::MergePair) bad_merge();
    if (mode_ == Mode::Merges) {
      mode_ = Mode::MergePair;
      pair_n_ = 0;
      return true;
    }
    if (pending_ == Pending::Merges) return enter_table(json::array(), t_.has_merges, t_.merges, text_size_ / 24, Mode::Merges);
    pending_ = Pending::None;
    stack_.push_back(place(json(json::value_t::array)));
    return true;
  }
  bool end_array() override {
    if (mode_ == Mode::MergePair) {
      if (pair_n_ != 2) bad_merge();
      t_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::Merges;
      return true;
    }
    if (mode_ == Mode::Merges) {
      mode_ = Mode::Normal;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(path_, ": invalid JSON: ", e.what());
  }

 private:
  enum class Mode { Normal, Vocab, Merges, MergePair };
  enum class Pending { None, Vocab, Merges };

  // A value into the current container (or as the root): where it landed.
  json* place(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(v));
      return &stack_.back()->back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  template <typename V>
  bool value(V&& v, const char* what) {
    if (mode_ == Mode::Vocab) fail(path_, ": model.vocab entry '", vkey_, "' is not an integer id (", what, ")");
    if (mode_ == Mode::Merges || mode_ == Mode::MergePair) bad_merge();
    pending_ = Pending::None;
    place(json(std::forward<V>(v)));
    return true;
  }
  bool vocab_id(int64_t v) {
    t_.vocab.emplace_back(std::move(vkey_), v);
    return true;
  }
  [[noreturn]] void bad_vocab() { fail(path_, ": model.vocab entry '", vkey_, "' is not an integer id"); }
  [[noreturn]] void bad_merge() {
    fail(path_, ": model.merges entry ", t_.merges.size(), " is neither \"a b\" nor [\"a\", \"b\"]");
  }

  const std::string& path_;
  BpeTables& t_;
  size_t text_size_;
  std::vector<json*> stack_;
  json* slot_ = nullptr;  // the member the next value of the current object goes to
  std::string top_key_, vkey_;
  Mode mode_ = Mode::Normal;
  Pending pending_ = Pending::None;
  std::string pair_[2];
  int pair_n_ = 0;
};

}  // namespace

json parse_tokenizer_json(const std::string& text, const std::string& path, BpeTables& tables) {
  Handler h(path, tables, text.size());
  json::sax_parse(text, &h);
  return std::move(h.root);
}

}  // namespace nf4flash::tok
