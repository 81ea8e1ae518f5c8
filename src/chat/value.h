// Chat-template values: the Python-like object model the Jinja-subset engine evaluates over.
// Kinds: undefined, none, bool, int, float, string (UTF-8), list, dict (insertion-ordered, string
// keys), namespace (a mutable dict shared by reference) and callable (macros, builtins, loop.cycle).
// Lists and dicts share their storage (shared_ptr) like Python objects; templates never mutate them
// (transformers renders in an immutable sandbox), only namespaces are written to.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace nf4flash::chat {

struct Value;
using ValueList = std::vector<Value>;

// Insertion-ordered dict with string keys (all a chat template needs: JSON objects, literals, kwargs).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value v);
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

class Evaluator;
using NativeFn = std::function<Value(Evaluator&, CallArgs&)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;  // String payload; for Undefined, the name that was looked up (for messages)
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;  // Dict and Namespace
  std::shared_ptr<Callable> fn;

  Value() = default;
  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value make_list(ValueList v = {});
  static Value make_dict(ValueDict v = {});
  static Value make_namespace(ValueDict v = {});
  static Value callable(std::string name, NativeFn fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
  double as_double() const { return kind == Kind::Float ? f : kind == Kind::Bool ? (b ? 1 : 0) : double(i); }
  int64_t as_int() const { return kind == Kind::Bool ? (b ? 1 : 0) : i; }

  bool truthy() const;
};

const char* kind_name(Kind k);

// Python semantics.
// The largest string a render may build (concatenation, repr); past it is an error.
constexpr size_t kMaxStringBytes = size_t(16) << 20;
// Error when a string of n bytes would pass kMaxStringBytes.
void check_string_size(size_t n);
std::string py_str(const Value& v);   // str(v): what {{ v }} prints (undefined prints "")
std::string py_repr(const Value& v);  // repr(v), used inside lists and dicts
std::string py_float_repr(double d);
bool py_equal(const Value& a, const Value& b);
// Three-way compare for <, <=, >, >=; returns false in `ok` when the kinds are not orderable.
int py_compare(const Value& a, const Value& b, bool& ok);

struct JsonDumpOptions {
  int indent = -1;          // < 0: single line
  std::string indent_str;   // used when indent_is_string
  bool indent_is_string = false;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_sep = ", ";  // Python default separators when indent is None
  std::string key_sep = ": ";
};
// json.dumps with the given options; throws Error for values JSON cannot hold.
std::string json_dumps(const Value& v, const JsonDumpOptions& opt);

// JSON input (nlohmann::json iterates object keys sorted; ordered_json keeps insertion order).
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

}  // namespace nf4flash::chat
