// Chat-template values: constructors, Python str/repr/equality/ordering, json.dumps, JSON input.
#include "chat/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "chat/strutil.h"
#include "core/error.h"

namespace nf4flash::chat {

const Value* ValueDict::find(const std::string& key) const {
  for (const auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

Value* ValueDict::find(const std::string& key) {
  for (auto& kv : items)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value v) {
  if (Value* p = find(key)) *p = std::move(v);
  else items.emplace_back(key, std::move(v));
}

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::none() { Value v; v.kind = Kind::None; return v; }
Value Value::boolean(bool x) { Value v; v.kind = Kind::Bool; v.b = x; return v; }
Value Value::integer(int64_t x) { Value v; v.kind = Kind::Int; v.i = x; return v; }
Value Value::number(double x) { Value v; v.kind = Kind::Float; v.f = x; return v; }
Value Value::string(std::string x) { Value v; v.kind = Kind::String; v.s = std::move(x); return v; }
Value Value::make_list(ValueList x) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<ValueList>(std::move(x));
  return v;
}
Value Value::make_dict(ValueDict x) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<ValueDict>(std::move(x));
  return v;
}
Value Value::make_namespace(ValueDict x) {
  Value v = make_dict(std::move(x));
  v.kind = Kind::Namespace;
  return v;
}
Value Value::callable(std::string name, NativeFn fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0.0;
    case Kind::String: return !s.empty();
    case Kind::List: return !list->empty();
    case Kind::Dict: return !dict->items.empty();
    case Kind::Namespace: case Kind::Callable: return true;
  }
  return false;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "namespace";
    case Kind::Callable: return "callable";
  }
  return "?";
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest %.{p}e that round-trips, then Python's repr layout (fixed for -4 <= exp < 16).
  char buf[64];
  for (int p = 0; p < 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string e(buf);
  size_t epos = e.find('e');
  std::string mant = e.substr(0, epos);
  int exp = std::atoi(e.c_str() + epos + 1);
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

void check_string_size(size_t n) {
  if (n > kMaxStringBytes) fail("a string of more than ", kMaxStringBytes >> 20, " MiB");
}

static std::string repr_string(const std::string& s) {
  check_string_size(2 * s.size());  // escaping at most doubles it
  char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<char32_t>(q)) { out += '\\'; out += q; }
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || (c >= 0x7f && c < 0xa0)) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      out += b;
    } else utf8_append(out, c);
  }
  out += q;
  return out;
}

std::string py_repr(const Value& v) {
  // nesting is bounded by what a render can build; a guard against pathological depth
  static thread_local int depth = 0;
  struct Depth {
    Depth() {
      if (++depth > 512) {
        --depth;
        fail("a value nested more than 512 levels deep");
      }
    }
    ~Depth() { --depth; }
  } guard;
  switch (v.kind) {
    case Kind::String: return repr_string(v.s);
    case Kind::List: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += py_repr((*v.list)[k]);
      }
      return out + "]";
    }
    case Kind::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, val] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(key) + ": " + py_repr(val);
      }
      return out + "}";
    }
    case Kind::Namespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [key, val] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(key) + ": " + py_repr(val);
      }
      return out + "}>";
    }
    default: return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return py_float_repr(v.f);
    case Kind::String: return v.s;
    case Kind::Callable: return "<function " + v.fn->name + ">";
    default: return py_repr(v);
  }
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined: case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!py_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, val] : a.dict->items) {
        const Value* o = b.dict->find(key);
        if (!o || !py_equal(val, *o)) return false;
      }
      return true;
    }
    case Kind::Namespace: return a.dict == b.dict;
    case Kind::Callable: return a.fn == b.fn;
    default: return false;
  }
}

int py_compare(const Value& a, const Value& b, bool& ok) {
  ok = true;
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.s.compare(b.s);  // UTF-8 byte order == code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (py_equal((*a.list)[k], (*b.list)[k])) continue;
      return py_compare((*a.list)[k], (*b.list)[k], ok);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  ok = false;
  return 0;
}

static void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char b[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (unsigned)(v >> 10), 0xdc00 + (unsigned)(v & 0x3ff));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
          }
          out += b;
        } else {
          utf8_append(out, c);
        }
      }
    }
  }
  out += '"';
}

static void json_dump(std::string& out, const Value& v, const JsonDumpOptions& opt, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    for (int k = 0; k < d; ++k) out += opt.indent_is_string ? opt.indent_str : std::string(opt.indent, ' ');
  };
  bool pretty = opt.indent >= 0 || opt.indent_is_string;
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(v.f);
      return;
    case Kind::String: json_string(out, v.s, opt.ensure_ascii); return;
    case Kind::List: {
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += opt.item_sep;
        if (pretty) newline(depth + 1);
        json_dump(out, (*v.list)[k], opt, depth + 1);
      }
      if (pretty) newline(depth);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += opt.item_sep;
        first = false;
        if (pretty) newline(depth + 1);
        json_string(out, kv->first, opt.ensure_ascii);
        out += opt.key_sep;
        json_dump(out, kv->second, opt, depth + 1);
      }
      if (pretty) newline(depth);
      out += '}';
      return;
    }
    default:
      fail("chat template: tojson: object of type ", kind_name(v.kind), " is not JSON serializable");
  }
}

std::string json_dumps(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  json_dump(out, v, opt, 0);
  return out;
}

template <typename Json>
static Value from_json_impl(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Value::number(double(u)) : Value::integer(int64_t(u));
    }
    case Json::value_t::number_float: return Value::number(j.template get<double>());
    case Json::value_t::string: return Value::string(j.template get<std::string>());
    case Json::value_t::array: {
      ValueList l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json_impl(e));
      return Value::make_list(std::move(l));
    }
    case Json::value_t::object: {
      // nlohmann::json iterates keys sorted; ordered_json keeps the file's order (as Python does).
      ValueDict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json_impl(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: return Value::none();
  }
}

Value from_json(const nlohmann::json& j) { return from_json_impl(j); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }

}  // namespace nf4flash::chat
