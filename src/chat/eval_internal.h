// Chat-template evaluator internals (not part of the interface; see eval.h): what the statement
// code (eval_statements.cpp) and the expression code (eval_expressions.cpp) both use.
#pragma once
#include <string_view>

#include "chat/ast.h"
#include "chat/eval.h"
#include "core/error.h"

namespace nf4flash::chat::detail {

inline bool has_prefix(const char* s, const char* p) { return std::string_view(s).rfind(p, 0) == 0; }

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

}  // namespace nf4flash::chat::detail
