// JSON Schema -> grammar nodes. Supported: type (one or a list), properties / required /
// additionalProperties (properties are written in the schema's order; optional ones may be left
// out; no property beyond the listed ones is written), free maps (additionalProperties: schema),
// items / prefixItems / minItems / maxItems, enum, const, minLength / maxLength (code points),
// minimum / maximum / exclusiveMinimum / exclusiveMaximum, anyOf, allOf of one schema, $ref into
// the document ($defs, definitions, any JSON pointer; recursion allowed), nullable, boolean
// schemas; format and annotations are accepted and do not constrain. Every other validation
// keyword (pattern, oneOf, not, uniqueItems, multipleOf, ...) is refused, each one named with
// where it is. Output has no whitespace; integers have at most 15 digits (more if a bound needs
// them) and numbers at most 6 decimals, so every value is bounded when its strings and arrays are.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace lily::structured {

// How a value is written: as JSON, or as the value of a Qwen tool-call parameter (strings raw up
// to "\n</parameter>", other types as compact JSON).
enum class ValueSyntax { kJson, kToolParam };

class SchemaCompiler {
 public:
  // root: the whole document ($ref targets are resolved inside it).
  SchemaCompiler(GrammarBuilder& b, const nlohmann::ordered_json& root);
  // The node for `schema` (a part of root, at JSON pointer `path`). Errors are collected; check
  // error() after the last call.
  uint32_t compile(const nlohmann::ordered_json& schema, const std::string& path, ValueSyntax syntax = ValueSyntax::kJson);
  // "" or a message naming every unsupported keyword (with its place) or invalid value.
  std::string error() const;

 private:
  uint32_t compile_typed(const nlohmann::ordered_json& s, const std::string& type, const std::string& path);
  uint32_t compile_object(const nlohmann::ordered_json& s, const std::string& path);
  uint32_t compile_array(const nlohmann::ordered_json& s, const std::string& path);
  uint32_t compile_number(const nlohmann::ordered_json& s, bool integer, const std::string& path);
  uint32_t tool_param(const nlohmann::ordered_json& s, const std::string& path);
  uint32_t ref(const std::string& target, const std::string& path, ValueSyntax syntax);
  uint32_t nothing();
  void fail(const std::string& msg);
  bool length(const nlohmann::ordered_json& s, const char* key, const std::string& path, int64_t& out);

  GrammarBuilder& b_;
  const nlohmann::ordered_json& root_;
  std::map<std::pair<std::string, int>, uint32_t> refs_;  // (pointer, syntax) -> node
  std::vector<std::string> unsupported_, errors_;
  int depth_ = 0;
};

}  // namespace lily::structured
