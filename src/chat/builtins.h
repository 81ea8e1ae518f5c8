// Chat-template builtins: filters (trim, tojson, join, map, selectattr, ...), tests (defined,
// string, none, equalto, ...), methods on strings/lists/dicts (startswith, split, items, get, ...)
// and global functions (namespace, range, dict, raise_exception, strftime_now).
// Errors are thrown without a position; the evaluator prefixes the line:column of the call.
#pragma once
#include <string>

#include "chat/value.h"

namespace nf4flash::chat {

class Evaluator;

Value call_filter(Evaluator& ev, const std::string& name, const Value& input, CallArgs& args);
bool call_test(Evaluator& ev, const std::string& name, const Value& input, CallArgs& args);
// Returns false when `obj` has no method `name` (the caller then tries attribute + call).
bool call_method(Evaluator& ev, const Value& obj, const std::string& name, CallArgs& args, Value& result);
// Global functions; nullptr when `name` is not one.
const Value* builtin_global(const std::string& name);

// Argument helpers for builtins: positional index `pos` or keyword `key`, else `def`.
const Value* arg_at(const CallArgs& a, size_t pos, const char* key);
void check_args(const CallArgs& a, const char* fn, size_t max_pos, std::initializer_list<const char*> keys);

}  // namespace nf4flash::chat
