// Chat-template filters: {{ x | name(args) }}. Semantics follow jinja2.filters, with tojson
// replaced by transformers' json.dumps-based version (ensure_ascii=False, no HTML escaping).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "chat/builtins.h"
#include "chat/eval.h"
#include "chat/strutil.h"
#include "core/error.h"

namespace nf4flash::chat {

const Value* arg_at(const CallArgs& a, size_t pos, const char* key) {
  if (pos < a.args.size()) return &a.args[pos];
  for (const auto& [k, v] : a.kwargs)
    if (k == key) return &v;
  return nullptr;
}

void check_args(const CallArgs& a, const char* fn, size_t max_pos, std::initializer_list<const char*> keys) {
  if (a.args.size() > max_pos) fail(fn, "(): takes at most ", max_pos, " positional argument(s), got ", a.args.size());
  for (const auto& kv : a.kwargs) {
    bool ok = false;
    for (const char* k : keys) ok = ok || kv.first == k;
    if (!ok) fail(fn, "(): unexpected keyword argument '", kv.first, "'");
  }
}

namespace {

using FilterFn = Value (*)(Evaluator&, const Value&, CallArgs&);

std::string need_string(const Value& v, const char* fn) {
  if (v.is_string()) return v.s;
  fail(fn, ": expected a string, got ", kind_name(v.kind));
}

bool opt_bool(const CallArgs& a, size_t pos, const char* key, bool def) {
  const Value* v = arg_at(a, pos, key);
  return v ? v->truthy() : def;
}

// jinja2's make_attrgetter: "a.b.0" walks attributes/items.
Value get_path(const Value& item, const Value& attr) {
  if (!attr.is_string()) return value_getitem(item, attr);
  Value cur = item;
  size_t pos = 0;
  const std::string& p = attr.s;
  while (true) {
    size_t dot = p.find('.', pos);
    std::string part = p.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? value_getitem(cur, Value::integer(std::stoll(part))) : value_getitem(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

// For sort/unique/min/max: case-insensitive unless asked otherwise.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(str_lower(v.s));
  return v;
}

int compare_or_fail(const Value& a, const Value& b) {
  bool ok;
  int c = py_compare(a, b, ok);
  if (!ok) fail("'<' not supported between '", kind_name(a.kind), "' and '", kind_name(b.kind), "'");
  return c;
}

Value f_trim(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "trim", 1, {"chars"});
  const Value* chars = arg_at(a, 0, "chars");
  std::string s = py_str(v);
  if (chars && chars->is_string()) return Value::string(str_strip(s, true, true, &chars->s));
  return Value::string(str_strip(s, true, true, nullptr));
}

Value f_tojson(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = opt_bool(a, 0, "ensure_ascii", false);
  if (const Value* ind = arg_at(a, 1, "indent"); ind && !ind->is_none()) {
    if (ind->is_string()) {
      o.indent_is_string = true;
      o.indent_str = ind->s;
    } else if (ind->kind == Kind::Int) {
      o.indent = static_cast<int>(std::max<int64_t>(0, ind->i));
    } else {
      fail("tojson: indent must be an integer or a string");
    }
    o.item_sep = ",";
  }
  if (const Value* sep = arg_at(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->list->size() != 2 || !(*sep->list)[0].is_string() || !(*sep->list)[1].is_string())
      fail("tojson: separators must be a pair of strings");
    o.item_sep = (*sep->list)[0].s;
    o.key_sep = (*sep->list)[1].s;
  }
  o.sort_keys = opt_bool(a, 3, "sort_keys", false);
  if (v.is_undefined()) fail("tojson: Object of type Undefined is not JSON serializable");
  return Value::string(json_dumps(v, o));
}

Value f_length(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "length", 0, {});
  switch (v.kind) {
    case Kind::Undefined: return Value::integer(0);
    case Kind::String: return Value::integer(static_cast<int64_t>(utf8_length(v.s)));
    case Kind::List: return Value::integer(static_cast<int64_t>(v.list->size()));
    case Kind::Dict: case Kind::Namespace: return Value::integer(static_cast<int64_t>(v.dict->items.size()));
    default: fail("length: object of type '", kind_name(v.kind), "' has no len()");
  }
}

Value f_upper(Evaluator&, const Value& v, CallArgs&) { return Value::string(str_upper(py_str(v))); }
Value f_lower(Evaluator&, const Value& v, CallArgs&) { return Value::string(str_lower(py_str(v))); }
Value f_title(Evaluator&, const Value& v, CallArgs&) { return Value::string(str_title(py_str(v))); }
Value f_capitalize(Evaluator&, const Value& v, CallArgs&) { return Value::string(str_capitalize(py_str(v))); }

Value f_replace(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "replace", 3, {"old", "new", "count"});
  const Value* from = arg_at(a, 0, "old");
  const Value* to = arg_at(a, 1, "new");
  if (!from || !to) fail("replace: needs the old and new strings");
  const Value* cnt = arg_at(a, 2, "count");
  int64_t count = cnt && !cnt->is_none() ? cnt->as_int() : -1;
  return Value::string(str_replace(py_str(v), py_str(*from), py_str(*to), count));
}

Value f_join(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "join", 2, {"d", "attribute"});
  const Value* d = arg_at(a, 0, "d");
  const Value* attr = arg_at(a, 1, "attribute");
  std::string sep = d ? py_str(*d) : "";
  std::string out;
  bool first = true;
  for (const Value& it : value_iterate(v, "join")) {
    if (!first) out += sep;
    first = false;
    out += py_str(attr ? get_path(it, *attr) : it);
  }
  return Value::string(std::move(out));
}

Value f_first(Evaluator&, const Value& v, CallArgs&) {
  ValueList l = value_iterate(v, "first");
  return l.empty() ? Value::undefined("first") : l.front();
}

Value f_last(Evaluator&, const Value& v, CallArgs&) {
  ValueList l = value_iterate(v, "last");
  return l.empty() ? Value::undefined("last") : l.back();
}

Value f_list(Evaluator&, const Value& v, CallArgs&) { return Value::make_list(value_iterate(v, "list")); }

Value f_default(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "default", 2, {"default_value", "boolean"});
  const Value* def = arg_at(a, 0, "default_value");
  bool boolean = opt_bool(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return def ? *def : Value::string("");
  return v;
}

Value f_string(Evaluator&, const Value& v, CallArgs&) { return Value::string(py_str(v)); }

bool parse_int(std::string s, int base, int64_t& out) {
  s = str_strip(s, true, true, nullptr);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, base);
  if (errno || *end) return false;
  out = v;
  return true;
}

bool parse_float(const std::string& raw, double& out) {
  std::string s = str_strip(raw, true, true, nullptr);
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return *end == 0;
}

Value f_int(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "int", 2, {"default", "base"});
  const Value* def = arg_at(a, 0, "default");
  const Value* base = arg_at(a, 1, "base");
  Value fallback = def ? *def : Value::integer(0);
  switch (v.kind) {
    case Kind::Int: return v;
    case Kind::Bool: return Value::integer(v.as_int());
    case Kind::Float:
      if (std::isnan(v.f) || std::isinf(v.f)) return fallback;
      return Value::integer(static_cast<int64_t>(std::trunc(v.f)));
    case Kind::String: {
      int64_t i;
      if (parse_int(v.s, base ? static_cast<int>(base->as_int()) : 10, i)) return Value::integer(i);
      double d;
      if (parse_float(v.s, d) && std::isfinite(d)) return Value::integer(static_cast<int64_t>(std::trunc(d)));
      return fallback;
    }
    default: return fallback;
  }
}

Value f_float(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "float", 1, {"default"});
  const Value* def = arg_at(a, 0, "default");
  if (v.is_number()) return Value::number(v.as_double());
  double d;
  if (v.is_string() && parse_float(v.s, d)) return Value::number(d);
  return def ? *def : Value::number(0.0);
}

Value f_items(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_mapping()) fail("items: expected a mapping, got ", kind_name(v.kind));
  ValueList out;
  for (const auto& [k, val] : v.dict->items) out.push_back(Value::make_list({Value::string(k), val}));
  return Value::make_list(std::move(out));
}

// select / reject / selectattr / rejectattr share this.
Value select_impl(Evaluator& ev, const Value& v, CallArgs& a, bool by_attr, bool keep_if) {
  size_t first = by_attr ? 1 : 0;
  if (by_attr && a.args.empty()) fail("selectattr/rejectattr: missing the attribute name");
  ValueList out;
  for (const Value& it : value_iterate(v, by_attr ? "selectattr" : "select")) {
    Value x = by_attr ? get_path(it, a.args[0]) : it;
    bool ok;
    if (a.args.size() > first) {
      CallArgs targs;
      targs.args.assign(a.args.begin() + first + 1, a.args.end());
      targs.kwargs = a.kwargs;
      ok = call_test(ev, need_string(a.args[first], "select test name"), x, targs);
    } else {
      ok = x.truthy();
    }
    if (ok == keep_if) out.push_back(it);
  }
  return Value::make_list(std::move(out));
}
Value f_select(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, true); }
Value f_reject(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, false); }
Value f_selectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, true); }
Value f_rejectattr(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, true, false); }

Value f_map(Evaluator& ev, const Value& v, CallArgs& a) {
  ValueList out;
  const Value* attr = nullptr;
  const Value* def = nullptr;
  for (const auto& [k, val] : a.kwargs) {
    if (k == "attribute") attr = &val;
    if (k == "default") def = &val;
  }
  if (attr) {
    for (const Value& it : value_iterate(v, "map")) {
      Value x = get_path(it, *attr);
      out.push_back(x.is_undefined() && def ? *def : x);
    }
    return Value::make_list(std::move(out));
  }
  if (a.args.empty()) fail("map: needs a filter name or attribute=");
  std::string name = need_string(a.args[0], "map filter name");
  CallArgs fargs;
  fargs.args.assign(a.args.begin() + 1, a.args.end());
  fargs.kwargs = a.kwargs;
  for (const Value& it : value_iterate(v, "map")) {
    CallArgs copy = fargs;
    out.push_back(call_filter(ev, name, it, copy));
  }
  return Value::make_list(std::move(out));
}

Value f_abs(Evaluator&, const Value& v, CallArgs&) {
  if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
  if (v.is_number()) return Value::integer(std::llabs(v.as_int()));
  fail("abs: bad operand type '", kind_name(v.kind), "'");
}

Value f_round(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "round", 2, {"precision", "method"});
  const Value* p = arg_at(a, 0, "precision");
  const Value* m = arg_at(a, 1, "method");
  int64_t prec = p ? p->as_int() : 0;
  std::string method = m ? py_str(*m) : "common";
  if (!v.is_number()) fail("round: expected a number");
  double x = v.as_double(), scale = std::pow(10.0, static_cast<double>(prec));
  double r;
  if (method == "common") {
    // Python's round(): correctly rounded, ties to even on the exact binary value (as printf does).
    if (prec >= 0 && prec < 300) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), x);
      r = std::strtod(buf, nullptr);
    } else {
      r = std::nearbyint(x * scale) / scale;
    }
  } else if (method == "ceil") {
    r = std::ceil(x * scale) / scale;
  } else if (method == "floor") {
    r = std::floor(x * scale) / scale;
  } else {
    fail("round: method must be 'common', 'ceil' or 'floor'");
  }
  return Value::number(r);
}

Value f_reverse(Evaluator&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = utf8_decode(v.s);
    std::reverse(cps.begin(), cps.end());
    return Value::string(utf8_encode(cps));
  }
  ValueList l = value_iterate(v, "reverse");
  std::reverse(l.begin(), l.end());
  return Value::make_list(std::move(l));
}

Value f_sort(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "sort", 3, {"reverse", "case_sensitive", "attribute"});
  bool rev = opt_bool(a, 0, "reverse", false);
  bool cs = opt_bool(a, 1, "case_sensitive", false);
  const Value* attr = arg_at(a, 2, "attribute");
  ValueList l = value_iterate(v, "sort");
  std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
    Value kx = sort_key(attr ? get_path(x, *attr) : x, cs), ky = sort_key(attr ? get_path(y, *attr) : y, cs);
    int c = compare_or_fail(kx, ky);
    return rev ? c > 0 : c < 0;
  });
  return Value::make_list(std::move(l));
}

Value f_unique(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "unique", 2, {"case_sensitive", "attribute"});
  bool cs = opt_bool(a, 0, "case_sensitive", false);
  const Value* attr = arg_at(a, 1, "attribute");
  ValueList out, seen;
  for (const Value& it : value_iterate(v, "unique")) {
    Value k = sort_key(attr ? get_path(it, *attr) : it, cs);
    bool dup = false;
    for (const Value& s : seen) dup = dup || py_equal(s, k);
    if (dup) continue;
    seen.push_back(k);
    out.push_back(it);
  }
  return Value::make_list(std::move(out));
}

Value minmax(const Value& v, CallArgs& a, bool want_max) {
  check_args(a, want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
  bool cs = opt_bool(a, 0, "case_sensitive", false);
  const Value* attr = arg_at(a, 1, "attribute");
  ValueList l = value_iterate(v, want_max ? "max" : "min");
  if (l.empty()) return Value::undefined();
  size_t best = 0;
  for (size_t k = 1; k < l.size(); ++k) {
    int c = compare_or_fail(sort_key(attr ? get_path(l[k], *attr) : l[k], cs),
                            sort_key(attr ? get_path(l[best], *attr) : l[best], cs));
    if (want_max ? c > 0 : c < 0) best = k;
  }
  return l[best];
}
Value f_min(Evaluator&, const Value& v, CallArgs& a) { return minmax(v, a, false); }
Value f_max(Evaluator&, const Value& v, CallArgs& a) { return minmax(v, a, true); }

Value f_sum(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "sum", 2, {"attribute", "start"});
  const Value* attr = arg_at(a, 0, "attribute");
  const Value* start = arg_at(a, 1, "start");
  Value acc = start ? *start : Value::integer(0);
  for (const Value& it : value_iterate(v, "sum")) {
    Value x = attr ? get_path(it, *attr) : it;
    if (!x.is_number() || !acc.is_number()) fail("sum: items must be numbers");
    if (x.kind == Kind::Float || acc.kind == Kind::Float) acc = Value::number(acc.as_double() + x.as_double());
    else acc = Value::integer(acc.as_int() + x.as_int());
  }
  return acc;
}

Value f_safe(Evaluator&, const Value& v, CallArgs&) { return v; }

Value f_escape(Evaluator&, const Value& v, CallArgs&) {
  std::string out;
  for (char c : py_str(v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value::string(std::move(out));
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::string cur;
  for (size_t k = 0; k < s.size(); ++k) {
    char c = s[k];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      if (c == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
      lines.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) lines.push_back(cur);
  return lines;
}

Value f_indent(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "indent", 3, {"width", "first", "blank"});
  const Value* w = arg_at(a, 0, "width");
  std::string ind = w ? (w->is_string() ? w->s : std::string(static_cast<size_t>(std::max<int64_t>(0, w->as_int())), ' '))
                      : std::string(4, ' ');
  bool first = opt_bool(a, 1, "first", false), blank = opt_bool(a, 2, "blank", false);
  std::vector<std::string> lines = split_lines(py_str(v) + "\n");
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
  }
  if (first) rv = ind + rv;
  return Value::string(std::move(rv));
}

Value f_wordcount(Evaluator&, const Value& v, CallArgs&) {
  return Value::integer(static_cast<int64_t>(str_split(py_str(v), nullptr, -1).size()));
}

Value f_dictsort(Evaluator&, const Value& v, CallArgs& a) {
  check_args(a, "dictsort", 3, {"case_sensitive", "by", "reverse"});
  bool cs = opt_bool(a, 0, "case_sensitive", false);
  const Value* by = arg_at(a, 1, "by");
  bool by_value = by && py_str(*by) == "value";
  bool rev = opt_bool(a, 2, "reverse", false);
  if (!v.is_mapping()) fail("dictsort: expected a mapping");
  ValueList pairs;
  for (const auto& [k, val] : v.dict->items) pairs.push_back(Value::make_list({Value::string(k), val}));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    int c = compare_or_fail(sort_key((*x.list)[by_value], cs), sort_key((*y.list)[by_value], cs));
    return rev ? c > 0 : c < 0;
  });
  return Value::make_list(std::move(pairs));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> m = {
      {"trim", f_trim},       {"tojson", f_tojson},       {"length", f_length},   {"count", f_length},
      {"upper", f_upper},     {"lower", f_lower},         {"title", f_title},     {"capitalize", f_capitalize},
      {"replace", f_replace}, {"join", f_join},           {"first", f_first},     {"last", f_last},
      {"list", f_list},       {"default", f_default},     {"d", f_default},       {"string", f_string},
      {"int", f_int},         {"float", f_float},         {"items", f_items},     {"select", f_select},
      {"reject", f_reject},   {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"map", f_map},
      {"abs", f_abs},         {"round", f_round},         {"reverse", f_reverse}, {"sort", f_sort},
      {"unique", f_unique},   {"min", f_min},             {"max", f_max},         {"sum", f_sum},
      {"safe", f_safe},       {"escape", f_escape},       {"e", f_escape},        {"forceescape", f_escape},
      {"indent", f_indent},   {"wordcount", f_wordcount}, {"dictsort", f_dictsort},
  };
  return m;
}

}  // namespace

Value call_filter(Evaluator& ev, const std::string& name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("unsupported filter '", name, "'");
  return it->second(ev, input, args);
}

}  // namespace nf4flash::chat
