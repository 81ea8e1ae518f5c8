// Chat-template evaluator, expressions (see eval.h): literals, names, lists and dicts, unary,
// binary and comparison operators with Python semantics, attribute/item/slice access, calls of
// macros, methods and functions, filters and tests, and the Python-flavoured value helpers
// (getattr, getitem, iteration, `in`) shared with the builtins.
#include "chat/eval.h"

#include <cmath>

#include "chat/builtins.h"
#include "chat/eval_internal.h"
#include "chat/strutil.h"
#include "core/error.h"

namespace nf4flash::chat {

using detail::with_position;

namespace {
// Budget of one `seq * n` (items of a list or bytes of a string).
constexpr int64_t kMaxRepeatItems = int64_t(16) << 20;
std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::None: return "NoneType";
    case Kind::String: return "str";
    default: return kind_name(v.kind);
  }
}

[[noreturn]] void undefined_error(const Value& v) {
  if (v.s.empty()) fail("value is undefined");
  fail("'", v.s, "' is undefined");
}
}  // namespace

// ---- Python-flavoured helpers -----------------------------------------------------------------

Value value_getattr(const Value& obj, const std::string& name) {
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return Value::undefined(name);
}

Value value_getitem(const Value& obj, const Value& key) {
  if (obj.is_mapping()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
    }
    return Value::undefined(key.is_string() ? key.s : py_str(key));
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.list->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined();
      return (*obj.list)[i];
    }
    std::vector<char32_t> cps = utf8_decode(obj.s);
    int64_t n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined();
    std::string c;
    utf8_append(c, cps[i]);
    return Value::string(c);
  }
  if (key.is_string()) return value_getattr(obj, key.s);
  return Value::undefined();
}

ValueList value_iterate(const Value& v, const char* what) {
  switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return *v.list;
    case Kind::Dict: case Kind::Namespace: {
      ValueList keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Kind::String: {
      ValueList chars;
      for (char32_t c : utf8_decode(v.s)) {
        std::string s;
        utf8_append(s, c);
        chars.push_back(Value::string(s));
      }
      return chars;
    }
    default: fail(what, ": '", type_name(v), "' object is not iterable");
  }
}

bool value_contains(const Value& c, const Value& item) {
  switch (c.kind) {
    case Kind::Undefined: return false;
    case Kind::String:
      if (item.is_undefined()) undefined_error(item);
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not ", type_name(item));
      return c.s.find(item.s) != std::string::npos;
    case Kind::List:
      for (const Value& x : *c.list)
        if (py_equal(x, item)) return true;
      return false;
    case Kind::Dict: case Kind::Namespace:
      return item.is_string() && c.dict->find(item.s) != nullptr;
    default: fail("argument of type '", type_name(c), "' is not iterable");
  }
}

// ---- evaluator --------------------------------------------------------------------------------

Value Evaluator::eval_in(const Expr& e, std::shared_ptr<Scope> scope) {
  ScopeSwap swap(*this, std::move(scope));
  return eval(e);
}

Value Evaluator::call(const Value& fn, CallArgs& args) {
  if (fn.kind != Kind::Callable) {
    if (fn.is_undefined()) undefined_error(fn);
    fail("'", type_name(fn), "' object is not callable");
  }
  return fn.fn->fn(*this, args);
}

CallArgs Evaluator::eval_args(const Expr& e, size_t first) {
  CallArgs a;
  for (size_t k = first; k < e.items.size(); ++k) a.args.push_back(eval(*e.items[k]));
  for (const auto& [key, ex] : e.kwargs) a.kwargs.emplace_back(key, eval(*ex));
  return a;
}

Value Evaluator::eval_call(const Expr& e) {
  const Expr& callee = *e.items[0];
  if (callee.kind == ExprKind::GetAttr) {
    Value obj = eval(*callee.items[0]);
    CallArgs a = eval_args(e, 1);
    Value result;
    bool handled = with_position(*this, e, [&] { return call_method(*this, obj, callee.name, a, result); });
    if (handled) return result;
    Value fn = value_getattr(obj, callee.name);
    if (fn.is_undefined() && !obj.is_undefined() && obj.kind != Kind::Namespace && obj.kind != Kind::Dict)
      error_at(e, "unsupported method '" + callee.name + "' on a " + type_name(obj) + " value");
    if (fn.is_undefined() && obj.kind == Kind::Dict)
      error_at(e, "unsupported dict method '" + callee.name + "' (and no such key holds a macro)");
    return with_position(*this, e, [&] { return call(fn, a); });
  }
  Value fn = eval(callee);
  CallArgs a = eval_args(e, 1);
  return with_position(*this, e, [&] { return call(fn, a); });
}

Value Evaluator::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  Value l = eval(*e.items[0]);
  if (op == "and") return l.truthy() ? eval(*e.items[1]) : l;
  if (op == "or") return l.truthy() ? l : eval(*e.items[1]);
  Value r = eval(*e.items[1]);
  if (op == "~") {
    std::string a = py_str(l), b = py_str(r);
    check_string_size(a.size() + b.size());
    return Value::string(std::move(a) + b);
  }
  return with_position(*this, e, [&]() -> Value {
    if (l.is_undefined()) undefined_error(l);
    if (r.is_undefined()) undefined_error(r);
    auto bad = [&]() -> Value {
      fail("unsupported operand type(s) for ", op, ": '", type_name(l), "' and '", type_name(r), "'");
    };
    if (l.is_number() && r.is_number()) {
      bool fl = l.kind == Kind::Float || r.kind == Kind::Float;
      if (op == "/") {
        if (r.as_double() == 0) fail("division by zero");
        return Value::number(l.as_double() / r.as_double());
      }
      if (op == "**") {
        if (!fl && r.as_int() >= 0) {  // by squaring; past 64 bits is an error (Python's ints have no bound)
          int64_t res = 1, b = l.as_int(), e = r.as_int();
          while (e > 0) {
            if ((e & 1) && __builtin_mul_overflow(res, b, &res)) fail("integer overflow in '**'");
            e >>= 1;
            if (e > 0 && __builtin_mul_overflow(b, b, &b)) fail("integer overflow in '**'");
          }
          return Value::integer(res);
        }
        return Value::number(std::pow(l.as_double(), r.as_double()));
      }
      if (fl) {
        double x = l.as_double(), y = r.as_double();
        if (op == "+") return Value::number(x + y);
        if (op == "-") return Value::number(x - y);
        if (op == "*") return Value::number(x * y);
        if (y == 0) fail("division by zero");
        if (op == "//") return Value::number(std::floor(x / y));
        if (op == "%") {
          double m = std::fmod(x, y);
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value::number(m);
        }
        return bad();
      }
      int64_t x = l.as_int(), y = r.as_int(), v = 0;
      if (op == "+" || op == "-" || op == "*") {
        const bool over = op == "+" ? __builtin_add_overflow(x, y, &v)
                          : op == "-" ? __builtin_sub_overflow(x, y, &v)
                                      : __builtin_mul_overflow(x, y, &v);
        if (over) fail("integer overflow in '", op, "'");
        return Value::integer(v);
      }
      if (y == 0) fail("division by zero");
      if (x == INT64_MIN && y == -1) fail("integer overflow in '", op, "'");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        q -= 1;
        m += y;
      }
      if (op == "//") return Value::integer(q);
      if (op == "%") return Value::integer(m);
      return bad();
    }
    if (op == "+") {
      if (l.is_string() && r.is_string()) {
        check_string_size(l.s.size() + r.s.size());
        return Value::string(l.s + r.s);
      }
      if (l.is_list() && r.is_list()) {
        ValueList out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::make_list(std::move(out));
      }
      return bad();
    }
    if (op == "*") {
      const Value& seq = l.is_number() ? r : l;
      const Value& cnt = l.is_number() ? l : r;
      if (!(cnt.kind == Kind::Int || cnt.kind == Kind::Bool)) return bad();
      int64_t times = std::max<int64_t>(0, cnt.as_int());
      const int64_t unit = seq.is_string() ? int64_t(seq.s.size()) : seq.is_list() ? int64_t(seq.list->size()) : 0;
      if (unit > 0 && times > kMaxRepeatItems / unit)
        fail("sequence repetition too big (more than ", kMaxRepeatItems, " items)");
      if (seq.is_string()) {
        std::string out;
        for (int64_t k = 0; k < times; ++k) out += seq.s;
        return Value::string(std::move(out));
      }
      if (seq.is_list()) {
        ValueList out;
        for (int64_t k = 0; k < times; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
        return Value::make_list(std::move(out));
      }
      return bad();
    }
    if (op == "%" && l.is_string()) fail("unsupported construct: printf-style '%' string formatting");
    return bad();
  });
}

Value Evaluator::eval_compare(const Expr& e) {
  Value left = eval(*e.items[0]);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.items[k + 1]);
    const std::string& op = e.ops[k];
    bool res = with_position(*this, e, [&]() -> bool {
      if (op == "==") return py_equal(left, right);
      if (op == "!=") return !py_equal(left, right);
      if (op == "in") return value_contains(right, left);
      if (op == "not in") return !value_contains(right, left);
      if (left.is_undefined()) undefined_error(left);
      if (right.is_undefined()) undefined_error(right);
      bool ok;
      int c = py_compare(left, right, ok);
      if (!ok) fail("'", op, "' not supported between '", type_name(left), "' and '", type_name(right), "'");
      if (op == "<") return c < 0;
      if (op == "<=") return c <= 0;
      if (op == ">") return c > 0;
      return c >= 0;
    });
    if (!res) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Evaluator::eval(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Literal:
      if (!e.name.empty() && filter_input_) return *filter_input_;
      return e.lit;
    case ExprKind::Name: return lookup(e.name);
    case ExprKind::List: {
      ValueList l;
      for (const auto& it : e.items) l.push_back(eval(*it));
      return Value::make_list(std::move(l));
    }
    case ExprKind::Dict: {
      ValueDict d;
      for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
        Value key = eval(*e.items[k]);
        if (!key.is_string()) error_at(*e.items[k], "unsupported construct: dict keys must be strings");
        d.set(key.s, eval(*e.items[k + 1]));
      }
      return Value::make_dict(std::move(d));
    }
    case ExprKind::Unary: {
      Value v = eval(*e.items[0]);
      if (e.name == "not") return Value::boolean(!v.truthy());
      if (!v.is_number()) {
        if (v.is_undefined()) with_position(*this, e, [&]() -> int { undefined_error(v); });
        error_at(e, "bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
      }
      if (e.name == "+") return v.kind == Kind::Bool ? Value::integer(v.as_int()) : v;
      if (v.kind == Kind::Float) return Value::number(-v.f);
      return Value::integer(-v.as_int());
    }
    case ExprKind::Binary: return eval_binary(e);
    case ExprKind::Compare: return eval_compare(e);
    case ExprKind::Cond:
      if (eval(*e.items[1]).truthy()) return eval(*e.items[0]);
      return e.items.size() > 2 ? eval(*e.items[2]) : Value::undefined();
    case ExprKind::GetAttr: return value_getattr(eval(*e.items[0]), e.name);
    case ExprKind::GetItem: {
      Value obj = eval(*e.items[0]);
      return value_getitem(obj, eval(*e.items[1]));
    }
    case ExprKind::Slice: {
      Value obj = eval(*e.items[0]);
      int64_t parts[3];
      const int64_t* ptr[3] = {nullptr, nullptr, nullptr};
      for (int k = 0; k < 3; ++k) {
        if (!e.has_slice[k]) continue;
        Value v = eval(*e.items[k + 1]);
        if (v.is_none()) continue;
        if (!(v.kind == Kind::Int || v.kind == Kind::Bool)) error_at(e, "slice indices must be integers");
        parts[k] = v.as_int();
        ptr[k] = &parts[k];
      }
      int64_t step = ptr[2] ? parts[2] : 1;
      if (step == 0) error_at(e, "slice step cannot be zero");
      if (obj.is_list()) {
        ValueList out;
        for (int64_t i : slice_indices(static_cast<int64_t>(obj.list->size()), ptr[0], ptr[1], step))
          out.push_back((*obj.list)[i]);
        return Value::make_list(std::move(out));
      }
      if (obj.is_string()) {
        std::vector<char32_t> cps = utf8_decode(obj.s);
        std::string out;
        for (int64_t i : slice_indices(static_cast<int64_t>(cps.size()), ptr[0], ptr[1], step)) utf8_append(out, cps[i]);
        return Value::string(std::move(out));
      }
      if (obj.is_undefined()) return Value::undefined();
      error_at(e, "'" + type_name(obj) + "' object is not subscriptable");
    }
    case ExprKind::Call: return eval_call(e);
    case ExprKind::Filter: {
      Value input = eval(*e.items[0]);
      CallArgs a = eval_args(e, 1);
      return with_position(*this, e, [&] { return call_filter(*this, e.name, input, a); });
    }
    case ExprKind::Test: {
      Value input = eval(*e.items[0]);
      CallArgs a = eval_args(e, 1);
      bool r = with_position(*this, e, [&] { return call_test(*this, e.name, input, a); });
      return Value::boolean(e.negated ? !r : r);
    }
  }
  error_at(e, "internal error: unknown expression");
}

}  // namespace nf4flash::chat
