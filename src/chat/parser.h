// Chat-template parser: tokens -> statement tree, following jinja2's grammar and operator
// precedence (or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary < postfix/filters).
// Constructs outside the supported subset fail with their name and line:column.
#pragma once
#include <string>

#include "chat/ast.h"

namespace nf4flash::chat {

Body parse_template(const std::string& source);

}  // namespace nf4flash::chat
