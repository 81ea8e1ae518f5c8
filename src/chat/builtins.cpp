// Chat-template tests (`is defined`, `is string`, ...), methods of strings/lists/dicts
// (`s.startswith(...)`, `d.items()`, ...) and global functions (namespace, range, raise_exception).
#include "chat/builtins.h"

#include <ctime>
#include <unordered_map>

#include "chat/eval.h"
#include "chat/strutil.h"
#include "core/error.h"

namespace nf4flash::chat {
namespace {

// ---- tests ------------------------------------------------------------------------------------

const Value& test_arg(const CallArgs& a, const char* test) {
  if (a.args.empty()) fail("test '", test, "' needs an argument");
  return a.args[0];
}

int cmp(const Value& x, const Value& y) {
  bool ok;
  int c = py_compare(x, y, ok);
  if (!ok) fail("comparison not supported between '", kind_name(x.kind), "' and '", kind_name(y.kind), "'");
  return c;
}

bool all_cased(const std::string& s, bool upper) {
  bool any = false;
  for (char c : s) {
    if (c >= 'a' && c <= 'z') {
      if (upper) return false;
      any = true;
    } else if (c >= 'A' && c <= 'Z') {
      if (!upper) return false;
      any = true;
    }
  }
  return any;
}

}  // namespace

bool call_test(Evaluator& ev, const std::string& n, const Value& v, CallArgs& a) {
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "boolean") return v.kind == Kind::Bool;
  if (n == "true") return v.kind == Kind::Bool && v.b;
  if (n == "false") return v.kind == Kind::Bool && !v.b;
  if (n == "integer") return v.kind == Kind::Int;
  if (n == "float") return v.kind == Kind::Float;
  if (n == "number") return v.is_number();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.is_dict();
  if (n == "iterable") return v.is_string() || v.is_list() || v.is_mapping() || v.is_undefined();
  if (n == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (n == "callable") return v.kind == Kind::Callable;
  if (n == "sameas") {
    const Value& o = test_arg(a, "sameas");
    if (v.kind != o.kind) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.kind == Kind::Bool) return v.b == o.b;
    if (v.is_list()) return v.list == o.list;
    if (v.is_mapping()) return v.dict == o.dict;
    return py_equal(v, o);
  }
  if (n == "eq" || n == "equalto" || n == "==") return py_equal(v, test_arg(a, "eq"));
  if (n == "ne" || n == "!=") return !py_equal(v, test_arg(a, "ne"));
  if (n == "lt" || n == "lessthan" || n == "<") return cmp(v, test_arg(a, "lt")) < 0;
  if (n == "le" || n == "<=") return cmp(v, test_arg(a, "le")) <= 0;
  if (n == "gt" || n == "greaterthan" || n == ">") return cmp(v, test_arg(a, "gt")) > 0;
  if (n == "ge" || n == ">=") return cmp(v, test_arg(a, "ge")) >= 0;
  if (n == "in") return value_contains(test_arg(a, "in"), v);
  if (n == "odd" || n == "even" || n == "divisibleby") {
    if (!(v.kind == Kind::Int || v.kind == Kind::Bool)) fail("test '", n, "' needs an integer");
    int64_t x = v.as_int();
    if (n == "odd") return ((x % 2) + 2) % 2 == 1;
    if (n == "even") return x % 2 == 0;
    int64_t d = test_arg(a, "divisibleby").as_int();
    if (d == 0) fail("divisibleby: division by zero");
    return x % d == 0;
  }
  if (n == "lower") return all_cased(py_str(v), false);
  if (n == "upper") return all_cased(py_str(v), true);
  if (n == "escaped") return false;
  fail("unsupported test '", n, "'");
}

namespace {

// ---- methods ----------------------------------------------------------------------------------

int64_t cp_index(const std::string& s, size_t byte_off) {
  return static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte_off)));
}

// Byte range of s[start:end] given optional code-point bounds (Python slice semantics).
std::string_view sub_range(const std::string& s, const CallArgs& a, size_t first, size_t& off) {
  const Value* st = arg_at(a, first, "start");
  const Value* en = arg_at(a, first + 1, "end");
  off = 0;
  if (!st && !en) return s;
  auto cps = utf8_decode(s);
  int64_t n = static_cast<int64_t>(cps.size());
  auto norm = [n](int64_t i) { return i < 0 ? std::max<int64_t>(0, i + n) : std::min(i, n); };
  int64_t b = st && !st->is_none() ? norm(st->as_int()) : 0;
  int64_t e = en && !en->is_none() ? norm(en->as_int()) : n;
  std::string pre = utf8_encode(std::vector<char32_t>(cps.begin(), cps.begin() + b));
  off = pre.size();
  if (e <= b) return std::string_view(s).substr(off, 0);
  std::string mid = utf8_encode(std::vector<char32_t>(cps.begin() + b, cps.begin() + e));
  return std::string_view(s).substr(off, mid.size());
}

bool affix_match(const std::string& s, const CallArgs& a, bool prefix) {
  if (a.args.empty()) fail(prefix ? "startswith" : "endswith", "() needs an argument");
  size_t off;
  std::string_view r = sub_range(s, a, 1, off);
  auto one = [&](const Value& p) {
    if (!p.is_string()) fail(prefix ? "startswith" : "endswith", "(): argument must be a string or a tuple of strings");
    if (p.s.size() > r.size()) return false;
    return prefix ? r.substr(0, p.s.size()) == p.s : r.substr(r.size() - p.s.size()) == p.s;
  };
  const Value& arg = a.args[0];
  if (arg.is_list()) {
    for (const Value& p : *arg.list)
      if (one(p)) return true;
    return false;
  }
  return one(arg);
}

const std::string* opt_str(const CallArgs& a, size_t pos, const char* key, const char* fn) {
  const Value* v = arg_at(a, pos, key);
  if (!v || v->is_none()) return nullptr;
  if (!v->is_string()) fail(fn, "(): argument must be a string or None");
  return &v->s;
}

Value string_list(std::vector<std::string> parts) {
  ValueList l;
  l.reserve(parts.size());
  for (auto& p : parts) l.push_back(Value::string(std::move(p)));
  return Value::make_list(std::move(l));
}

std::string py_title(const std::string& s) {
  auto cps = utf8_decode(s);
  bool prev_cased = false;
  for (char32_t& c : cps) {
    bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (lower || upper) {
      c = prev_cased ? ascii_lower(c) : ascii_upper(c);
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return utf8_encode(cps);
}

template <typename Pred>
bool all_of_cps(const std::string& s, Pred p) {
  auto cps = utf8_decode(s);
  if (cps.empty()) return false;
  for (char32_t c : cps)
    if (!p(c)) return false;
  return true;
}

bool string_method(const std::string& s, const std::string& n, CallArgs& a, Value& r) {
  if (n == "startswith" || n == "endswith") {
    r = Value::boolean(affix_match(s, a, n == "startswith"));
  } else if (n == "strip" || n == "lstrip" || n == "rstrip") {
    check_args(a, n.c_str(), 1, {"chars"});
    r = Value::string(str_strip(s, n != "rstrip", n != "lstrip", opt_str(a, 0, "chars", n.c_str())));
  } else if (n == "split" || n == "rsplit") {
    check_args(a, n.c_str(), 2, {"sep", "maxsplit"});
    const Value* m = arg_at(a, 1, "maxsplit");
    int64_t maxsplit = m ? m->as_int() : -1;
    const std::string* sep = opt_str(a, 0, "sep", n.c_str());
    r = string_list(n == "split" ? str_split(s, sep, maxsplit) : str_rsplit(s, sep, maxsplit));
  } else if (n == "splitlines") {
    std::vector<std::string> lines;
    std::string cur;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '\n' || s[k] == '\r') {
        if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
        lines.push_back(cur);
        cur.clear();
      } else {
        cur += s[k];
      }
    }
    if (!cur.empty()) lines.push_back(cur);
    r = string_list(std::move(lines));
  } else if (n == "upper") {
    r = Value::string(str_upper(s));
  } else if (n == "lower") {
    r = Value::string(str_lower(s));
  } else if (n == "title") {
    r = Value::string(py_title(s));
  } else if (n == "capitalize") {
    r = Value::string(str_capitalize(s));
  } else if (n == "replace") {
    if (a.args.size() < 2 || !a.args[0].is_string() || !a.args[1].is_string()) fail("replace() needs two strings");
    int64_t count = a.args.size() > 2 ? a.args[2].as_int() : -1;
    r = Value::string(str_replace(s, a.args[0].s, a.args[1].s, count));
  } else if (n == "find" || n == "rfind" || n == "index" || n == "rindex" || n == "count") {
    if (a.args.empty() || !a.args[0].is_string()) fail(n, "() needs a string argument");
    size_t off;
    std::string_view range = sub_range(s, a, 1, off);
    const std::string& sub = a.args[0].s;
    if (n == "count") {
      int64_t c = 0;
      if (sub.empty()) {
        c = static_cast<int64_t>(utf8_length(range)) + 1;
      } else {
        for (size_t p = range.find(sub); p != std::string_view::npos; p = range.find(sub, p + sub.size())) ++c;
      }
      r = Value::integer(c);
    } else {
      size_t p = (n == "find" || n == "index") ? range.find(sub) : range.rfind(sub);
      if (p == std::string_view::npos) {
        if (n == "index" || n == "rindex") fail("substring not found");
        r = Value::integer(-1);
      } else {
        r = Value::integer(cp_index(s, off + p));
      }
    }
  } else if (n == "join") {
    if (a.args.size() != 1) fail("join() takes one argument");
    std::string out;
    bool first = true;
    for (const Value& it : value_iterate(a.args[0], "join")) {
      if (!it.is_string()) fail("join(): sequence item must be a string, not ", kind_name(it.kind));
      if (!first) out += s;
      first = false;
      out += it.s;
    }
    r = Value::string(std::move(out));
  } else if (n == "isdigit" || n == "isnumeric" || n == "isdecimal") {
    r = Value::boolean(all_of_cps(s, [](char32_t c) { return c >= '0' && c <= '9'; }));
  } else if (n == "isalpha") {
    r = Value::boolean(all_of_cps(s, [](char32_t c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }));
  } else if (n == "isalnum") {
    r = Value::boolean(all_of_cps(s, [](char32_t c) { return ((c | 32) >= 'a' && (c | 32) <= 'z') || (c >= '0' && c <= '9'); }));
  } else if (n == "isspace") {
    r = Value::boolean(all_of_cps(s, py_isspace));
  } else if (n == "islower" || n == "isupper") {
    r = Value::boolean(all_cased(s, n == "isupper"));
  } else {
    return false;
  }
  return true;
}

bool list_method(const Value& l, const std::string& n, CallArgs& a, Value& r) {
  if (n == "index" || n == "count") {
    if (a.args.empty()) fail(n, "() needs an argument");
    int64_t c = 0;
    for (size_t k = 0; k < l.list->size(); ++k) {
      if (!py_equal((*l.list)[k], a.args[0])) continue;
      if (n == "index") {
        r = Value::integer(static_cast<int64_t>(k));
        return true;
      }
      ++c;
    }
    if (n == "index") fail("list.index(x): x not in list");
    r = Value::integer(c);
    return true;
  }
  if (n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" || n == "clear" ||
      n == "sort" || n == "reverse")
    fail("unsupported: list.", n, "() modifies a list (templates render in an immutable sandbox, as in transformers)");
  return false;
}

bool dict_method(const Value& d, const std::string& n, CallArgs& a, Value& r) {
  if (n == "items" || n == "keys" || n == "values") {
    ValueList out;
    for (const auto& [k, v] : d.dict->items) {
      if (n == "items") out.push_back(Value::make_list({Value::string(k), v}));
      else out.push_back(n == "keys" ? Value::string(k) : v);
    }
    r = Value::make_list(std::move(out));
    return true;
  }
  if (n == "get") {
    if (a.args.empty()) fail("get() needs a key");
    const Value* v = a.args[0].is_string() ? d.dict->find(a.args[0].s) : nullptr;
    r = v ? *v : (a.args.size() > 1 ? a.args[1] : Value::none());
    return true;
  }
  if (n == "update" || n == "pop" || n == "popitem" || n == "setdefault" || n == "clear")
    fail("unsupported: dict.", n, "() modifies a dict (templates render in an immutable sandbox, as in transformers)");
  return false;
}

// ---- globals ----------------------------------------------------------------------------------

Value g_range(Evaluator&, CallArgs& a) {
  if (a.args.empty() || a.args.size() > 3) fail("range() takes 1 to 3 arguments");
  for (const Value& v : a.args)
    if (!(v.kind == Kind::Int || v.kind == Kind::Bool)) fail("range(): arguments must be integers");
  int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) {
    stop = a.args[0].as_int();
  } else {
    start = a.args[0].as_int();
    stop = a.args[1].as_int();
    if (a.args.size() == 3) step = a.args[2].as_int();
  }
  if (step == 0) fail("range() step must not be zero");
  ValueList out;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (out.size() >= 100000) fail("range() too big (more than 100000 items)");
    out.push_back(Value::integer(k));
  }
  return Value::make_list(std::move(out));
}

Value g_namespace(Evaluator& ev, CallArgs& a) {
  ValueDict d;
  for (const Value& v : a.args) {
    if (!v.is_mapping()) fail("namespace(): positional arguments must be mappings");
    for (const auto& [k, x] : v.dict->items) d.set(k, x);
  }
  for (auto& [k, v] : a.kwargs) d.set(k, v);
  Value ns = Value::make_namespace(std::move(d));
  ev.own_namespace(ns.dict);
  return ns;
}

Value g_dict(Evaluator&, CallArgs& a) {
  ValueDict d;
  for (const Value& v : a.args) {
    if (!v.is_mapping()) fail("dict(): positional arguments must be mappings");
    for (const auto& [k, x] : v.dict->items) d.set(k, x);
  }
  for (auto& [k, v] : a.kwargs) d.set(k, v);
  return Value::make_dict(std::move(d));
}

Value g_raise(Evaluator&, CallArgs& a) {
  fail("raise_exception: ", a.args.empty() ? std::string("(no message)") : py_str(a.args[0]));
}

Value g_strftime_now(Evaluator&, CallArgs& a) {
  if (a.args.size() != 1 || !a.args[0].is_string()) fail("strftime_now() takes one format string");
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[256];
  size_t n = std::strftime(buf, sizeof buf, a.args[0].s.c_str(), &tm);
  return Value::string(std::string(buf, n));
}

}  // namespace

bool call_method(Evaluator& ev, const Value& obj, const std::string& name, CallArgs& args, Value& result) {
  switch (obj.kind) {
    case Kind::String: return string_method(obj.s, name, args, result);
    case Kind::List: return list_method(obj, name, args, result);
    case Kind::Dict: return dict_method(obj, name, args, result);
    default: return false;
  }
}

const Value* builtin_global(const std::string& name) {
  static const std::unordered_map<std::string, Value> globals = {
      {"range", Value::callable("range", g_range)},
      {"namespace", Value::callable("namespace", g_namespace)},
      {"dict", Value::callable("dict", g_dict)},
      {"raise_exception", Value::callable("raise_exception", g_raise)},
      {"strftime_now", Value::callable("strftime_now", g_strftime_now)},
  };
  auto it = globals.find(name);
  return it == globals.end() ? nullptr : &it->second;
}

}  // namespace nf4flash::chat
