// Jinja parser: token stream -> AST, following jinja2.parser's grammar and precedence.
// Anything outside the supported subset is a load-time error naming the line.
#pragma once
#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"

namespace lily::jinja {

// Throws jinja::Error (with line) on syntax errors, unsupported tags, unknown filters or tests.
Body parse(const std::vector<Token>& tokens);

// Registries (defined with the builtins) so unknown names fail at load time, as in jinja2.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace lily::jinja
