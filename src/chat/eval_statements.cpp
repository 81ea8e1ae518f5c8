// Chat-template evaluator, statements and control flow (see eval.h): scopes and variable lookup,
// rendering a body into the output, if/for (with the loop object, filters, else and break/continue),
// set and set blocks, with, filter and call blocks, and macro definitions with their closures.
// Expressions are evaluated in eval_expressions.cpp.
#include "chat/eval.h"

#include "chat/builtins.h"
#include "chat/eval_internal.h"
#include "core/error.h"

namespace nf4flash::chat {

using detail::with_position;

namespace {
constexpr int kMaxDepth = 200;  // macro recursion limit
// Budgets of one render: real chat templates run a few thousand statements and write kilobytes.
constexpr int64_t kMaxSteps = 250'000;
constexpr size_t kMaxOutputBytes = size_t(64) << 20;
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
  std::string* saved_out = std::exchange(out_, &out);
  try {
    ScopeSwap swap(*this, std::move(scope));
    exec(body);
  } catch (...) {
    out_ = saved_out;
    --depth_;
    throw;
  }
  out_ = saved_out;
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
  if (++steps_ > kMaxSteps) error_at(s, cat("the template ran more than ", kMaxSteps, " statements"));
  if (out_ && out_->size() > kMaxOutputBytes) error_at(s, cat("the template wrote more than ", kMaxOutputBytes >> 20, " MiB"));
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
      ScopeSwap swap(*this, std::move(inner));
      return exec(s.body);
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
  const std::shared_ptr<Scope> outer = scope_;
  if (s.cond) {
    ValueList kept;
    for (const Value& it : items) {
      auto sc = std::make_shared<Scope>();
      sc->parent = outer;
      assign_targets(*sc, s.targets, it, s);
      ScopeSwap swap(*this, std::move(sc));
      if (eval(*s.cond).truthy()) kept.push_back(it);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec(s.else_body);
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    if (++steps_ > kMaxSteps) error_at(s, cat("the template ran more than ", kMaxSteps, " statements"));
    auto sc = std::make_shared<Scope>();
    sc->parent = outer;
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
    ScopeSwap swap(*this, std::move(sc));
    if (exec(s.body) == Flow::Break) break;
  }
  return Flow::Normal;
}

void Evaluator::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (!s.text.empty()) {
    Value ns = lookup(s.targets[0]);
    if (ns.kind != Kind::Namespace)
      error_at(s, "cannot assign attribute '" + s.text + "' on '" + s.targets[0] + "' (only namespace() objects)");
    // namespaces are the only mutable values: refusing a value that reaches this one keeps every
    // value acyclic (so printing, tojson and comparisons end)
    std::vector<const Value*> todo{&v};
    while (!todo.empty()) {
      const Value* x = todo.back();
      todo.pop_back();
      if ((x->kind == Kind::Namespace || x->kind == Kind::Dict) && x->dict) {
        if (x->dict == ns.dict) error_at(s, "cannot store namespace '" + s.targets[0] + "' inside itself");
        for (const auto& kv : x->dict->items) todo.push_back(&kv.second);
      } else if (x->kind == Kind::List && x->list) {
        for (const Value& y : *x->list) todo.push_back(&y);
      }
    }
    ns.dict->set(s.text, std::move(v));
    return;
  }
  assign_targets(*scope_, s.targets, v, s);
}

Evaluator::~Evaluator() {
  for (auto& sc : macro_scopes_) sc->vars.clear();
  for (auto& w : namespaces_)
    if (auto d = w.lock()) d->items.clear();
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

}  // namespace nf4flash::chat
