// Chat-template evaluator (see eval.h).
#include "chat/eval.h"

#include <cmath>

#include "chat/builtins.h"
#include "chat/strutil.h"
#include "core/error.h"

namespace nf4flash::chat {

namespace {
constexpr int kMaxDepth = 200;  // macro recursion limit

bool has_prefix(const char* s, const char* p) { return std::string_view(s).rfind(p, 0) == 0; }

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

Value* Scope::find(const std::string& name) {
  for (auto& kv : vars)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  if (Value* p = find(name)) *p = std::move(v);
  else vars.emplace_back(name, std::move(v));
}

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

namespace {
// Re-throws builtin errors (which carry no position) with the expression's line:column.
template <typename F>
auto with_position(const Evaluator& ev, const Expr& e, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& err) {
    if (has_prefix(err.what(), "chat template")) throw;
    ev.error_at(e, err.what());
  }
}
}  // namespace

// ---- evaluator --------------------------------------------------------------------------------

Evaluator::Evaluator(ValueDict context) : context_(std::move(context)), scope_(std::make_shared<Scope>()) {}

void Evaluator::error_at(const Expr& e, const std::string& msg) const {
  fail("chat template: line ", e.line, ":", e.col, ": ", msg);
}
void Evaluator::error_at(const Stmt& s, const std::string& msg) const {
  fail("chat template: line ", s.line, ":", s.col, ": ", msg);
}

std::string Evaluator::render(const Body& body) {
  std::string out;
  out_ = &out;
  exec(body);
  out_ = nullptr;
  return out;
}

std::string Evaluator::render_in(const Body& body, std::shared_ptr<Scope> scope) {
  if (++depth_ > kMaxDepth) fail("maximum macro recursion depth (", kMaxDepth, ") exceeded");
  std::string out;
  std::string* saved_out = out_;
  auto saved_scope = scope_;
  out_ = &out;
  scope_ = std::move(scope);
  try {
    exec(body);
  } catch (...) {
    out_ = saved_out;
    scope_ = saved_scope;
    --depth_;
    throw;
  }
  out_ = saved_out;
  scope_ = saved_scope;
  --depth_;
  return out;
}

Value Evaluator::lookup(const std::string& name) {
  for (Scope* s = scope_.get(); s; s = s->parent.get())
    if (Value* v = s->find(name)) return *v;
  if (const Value* v = context_.find(name)) return *v;
  if (const Value* g = builtin_global(name)) return *g;
  return Value::undefined(name);
}

Evaluator::Flow Evaluator::exec(const Body& body) {
  for (const auto& s : body) {
    Flow f = exec_stmt(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Evaluator::Flow Evaluator::exec_stmt(const Stmt& s) {
  switch (s.kind) {
    case StmtKind::Text: *out_ += s.text; return Flow::Normal;
    case StmtKind::Emit: *out_ += py_str(eval(*s.expr)); return Flow::Normal;
    case StmtKind::If:
      for (size_t k = 0; k < s.conds.size(); ++k)
        if (eval(*s.conds[k]).truthy()) return exec(s.bodies[k]);
      return exec(s.else_body);
    case StmtKind::For: return exec_for(s);
    case StmtKind::Set: exec_set(s); return Flow::Normal;
    case StmtKind::SetBlock: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope_;
      Value v = Value::string(render_in(s.body, inner));
      scope_->set(s.targets[0], std::move(v));
      return Flow::Normal;
    }
    case StmtKind::Macro: define_macro(s, s.text); return Flow::Normal;
    case StmtKind::CallBlock: {
      // {% call(params) m(args) %}body{% endcall %}: m gets caller=<macro rendering body>.
      define_macro(s, "caller");
      Value caller = *scope_->find("caller");
      const Expr& call_expr = *s.expr;
      Value fn = eval(*call_expr.items[0]);
      CallArgs a = eval_args(call_expr, 1);
      a.kwargs.emplace_back("caller", caller);
      *out_ += py_str(with_position(*this, call_expr, [&] { return call(fn, a); }));
      return Flow::Normal;
    }
    case StmtKind::FilterBlock: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope_;
      Value body = Value::string(render_in(s.body, inner));
      const Value* saved = filter_input_;
      filter_input_ = &body;
      Value r = eval(*s.expr);
      filter_input_ = saved;
      *out_ += py_str(r);
      return Flow::Normal;
    }
    case StmtKind::With: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope_;
      for (size_t k = 0; k < s.targets.size(); ++k) inner->set(s.targets[k], eval(*s.conds[k]));
      auto saved = scope_;
      scope_ = inner;
      Flow f;
      try {
        f = exec(s.body);
      } catch (...) {
        scope_ = saved;
        throw;
      }
      scope_ = saved;
      return f;
    }
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

void Evaluator::assign_targets(Scope& scope, const std::vector<std::string>& targets, const Value& v,
                               const Stmt& at) {
  if (targets.size() == 1) {
    scope.set(targets[0], v);
    return;
  }
  ValueList items;
  try {
    items = value_iterate(v, "cannot unpack");
  } catch (const Error& e) {
    error_at(at, e.what());
  }
  if (items.size() != targets.size())
    error_at(at, cat("cannot unpack ", items.size(), " value(s) into ", targets.size(), " variables"));
  for (size_t k = 0; k < targets.size(); ++k) scope.set(targets[k], items[k]);
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s) {
  Value seq = eval(*s.expr);
  ValueList items;
  try {
    items = value_iterate(seq, "for loop");
  } catch (const Error& e) {
    error_at(*s.expr, e.what());
  }
  auto saved = scope_;
  if (s.cond) {
    ValueList kept;
    for (const Value& it : items) {
      auto sc = std::make_shared<Scope>();
      sc->parent = saved;
      assign_targets(*sc, s.targets, it, s);
      scope_ = sc;
      bool keep;
      try {
        keep = eval(*s.cond).truthy();
      } catch (...) {
        scope_ = saved;
        throw;
      }
      scope_ = saved;
      if (keep) kept.push_back(it);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(s.else_body);
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    auto sc = std::make_shared<Scope>();
    sc->parent = saved;
    assign_targets(*sc, s.targets, items[k], s);
    ValueDict loop;
    loop.set("index", Value::integer(k + 1));
    loop.set("index0", Value::integer(k));
    loop.set("revindex", Value::integer(n - k));
    loop.set("revindex0", Value::integer(n - k - 1));
    loop.set("first", Value::boolean(k == 0));
    loop.set("last", Value::boolean(k == n - 1));
    loop.set("length", Value::integer(n));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", k > 0 ? items[k - 1] : Value::undefined("previtem"));
    loop.set("nextitem", k + 1 < n ? items[k + 1] : Value::undefined("nextitem"));
    loop.set("cycle", Value::callable("loop.cycle", [k](Evaluator&, CallArgs& a) {
      if (a.args.empty()) fail("loop.cycle() needs at least one argument");
      return a.args[k % a.args.size()];
    }));
    sc->set("loop", Value::make_dict(std::move(loop)));
    scope_ = sc;
    Flow f;
    try {
      f = exec(s.body);
    } catch (...) {
      scope_ = saved;
      throw;
    }
    scope_ = saved;
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

void Evaluator::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (!s.text.empty()) {
    Value ns = lookup(s.targets[0]);
    if (ns.kind != Kind::Namespace)
      error_at(s, "cannot assign attribute '" + s.text + "' on '" + s.targets[0] + "' (only namespace() objects)");
    ns.dict->set(s.text, std::move(v));
    return;
  }
  assign_targets(*scope_, s.targets, v, s);
}

Evaluator::~Evaluator() {
  for (auto& sc : macro_scopes_) sc->vars.clear();
}

void Evaluator::define_macro(const Stmt& s, const std::string& bind_name) {
  const Stmt* def = &s;
  std::shared_ptr<Scope> closure = scope_;
  if (macro_scopes_.empty() || macro_scopes_.back() != scope_) macro_scopes_.push_back(scope_);
  std::string name = bind_name;
  Value fn = Value::callable(name, [def, closure, name](Evaluator& ev, CallArgs& a) -> Value {
    auto sc = std::make_shared<Scope>();
    sc->parent = closure;
    if (a.args.size() > def->params.size())
      fail("macro '", name, "' takes not more than ", def->params.size(), " argument(s)");
    for (size_t k = 0; k < a.args.size(); ++k) sc->set(def->params[k], a.args[k]);
    for (auto& [key, val] : a.kwargs) {
      bool known = key == "caller";
      for (size_t k = 0; k < def->params.size(); ++k) {
        if (def->params[k] != key) continue;
        if (k < a.args.size()) fail("macro '", name, "' got multiple values for argument '", key, "'");
        known = true;
      }
      if (!known) fail("macro '", name, "' has no argument named '", key, "'");
      sc->set(key, val);
    }
    for (size_t k = a.args.size(); k < def->params.size(); ++k) {
      if (sc->find(def->params[k])) continue;
      sc->set(def->params[k], def->conds[k] ? ev.eval_in(*def->conds[k], sc) : Value::undefined(def->params[k]));
    }
    return Value::string(ev.render_in(def->body, sc));
  });
  scope_->set(bind_name, std::move(fn));
}

Value Evaluator::eval_in(const Expr& e, std::shared_ptr<Scope> scope) {
  auto saved = scope_;
  scope_ = std::move(scope);
  try {
    Value v = eval(e);
    scope_ = saved;
    return v;
  } catch (...) {
    scope_ = saved;
    throw;
  }
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
  if (op == "~") return Value::string(py_str(l) + py_str(r));
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
        if (!fl && r.as_int() >= 0) {
          int64_t res = 1, b = l.as_int();
          for (int64_t k = 0; k < r.as_int(); ++k) res *= b;
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
      int64_t x = l.as_int(), y = r.as_int();
      if (op == "+") return Value::integer(x + y);
      if (op == "-") return Value::integer(x - y);
      if (op == "*") return Value::integer(x * y);
      if (y == 0) fail("division by zero");
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
      if (l.is_string() && r.is_string()) return Value::string(l.s + r.s);
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
