// Chat-template evaluator: walks the statement tree with Jinja scoping (for/macro/with bodies get
// their own scope, if does not; namespaces carry state out of loops) and Python value semantics.
// One Evaluator renders one template once; it is cheap to construct.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/ast.h"
#include "chat/value.h"

namespace nf4flash::chat {

struct Scope {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Scope> parent;
  Value* find(const std::string& name);
  void set(const std::string& name, Value v);
};

class Evaluator {
 public:
  // `context` holds the render variables (messages, add_generation_prompt, bos_token, ...).
  explicit Evaluator(ValueDict context);
  // Clears the variables of every scope that received a macro: a macro value captures its defining
  // scope, which holds the macro (a shared_ptr cycle that would otherwise outlive the render).
  ~Evaluator();
  // namespace() registers the objects it makes (see namespaces_).
  void own_namespace(const std::shared_ptr<ValueDict>& d) { namespaces_.push_back(d); }
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  std::string render(const Body& body);

  // Used by builtins and macros.
  Value eval(const Expr& e);
  Value eval_in(const Expr& e, std::shared_ptr<Scope> scope);  // eval with `scope` as innermost
  Value lookup(const std::string& name);
  std::string render_in(const Body& body, std::shared_ptr<Scope> scope);
  const std::shared_ptr<Scope>& scope() const { return scope_; }
  // Calls a callable value (macro or builtin function).
  Value call(const Value& fn, CallArgs& args);

  [[noreturn]] void error_at(const Expr& e, const std::string& msg) const;
  [[noreturn]] void error_at(const Stmt& s, const std::string& msg) const;

 private:
  enum class Flow { Normal, Break, Continue };

  ValueDict context_;
  std::shared_ptr<Scope> scope_;
  std::vector<std::shared_ptr<Scope>> macro_scopes_;  // see ~Evaluator
  // namespace() objects of this render: a template may store one inside itself (a reference cycle),
  // so ~Evaluator empties those still alive
  std::vector<std::weak_ptr<ValueDict>> namespaces_;
  std::string* out_ = nullptr;
  const Value* filter_input_ = nullptr;
  int depth_ = 0;
  int64_t steps_ = 0;  // statements executed (a template from a download must not run forever)

  // Makes `scope` the current scope for its lifetime and restores the previous one, also when an
  // error unwinds.
  class ScopeSwap {
   public:
    ScopeSwap(Evaluator& ev, std::shared_ptr<Scope> scope) : ev_(ev), saved_(std::exchange(ev.scope_, std::move(scope))) {}
    ~ScopeSwap() { ev_.scope_ = std::move(saved_); }
    ScopeSwap(const ScopeSwap&) = delete;
    ScopeSwap& operator=(const ScopeSwap&) = delete;

   private:
    Evaluator& ev_;
    std::shared_ptr<Scope> saved_;
  };

  Flow exec(const Body& body);
  Flow exec_stmt(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Stmt& s);
  void define_macro(const Stmt& s, const std::string& bind_name);
  void assign_targets(Scope& scope, const std::vector<std::string>& targets, const Value& v, const Stmt& at);

  Value eval_binary(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_args_and_filter(const Expr& e);
  CallArgs eval_args(const Expr& e, size_t first);
};

// Python-flavoured helpers shared by the evaluator and the builtins.
Value value_getattr(const Value& obj, const std::string& name);
Value value_getitem(const Value& obj, const Value& key);
ValueList value_iterate(const Value& v, const char* what);  // throws for non-iterables
bool value_contains(const Value& container, const Value& item);

}  // namespace nf4flash::chat
