// The grammar of a whole constrained reply, from what a request asks: a JSON value (response
// format json_object / json_schema), tool calls in Qwen's format with their arguments following
// the tools' parameter schemas (strict tools), or either of the two. The API layers map their own
// request fields onto OutputSpec; the errors name what is not supported.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "structured/grammar.h"

namespace lily::structured {

struct ToolGrammar {
  std::string name;
  const nlohmann::ordered_json* parameters = nullptr;  // JSON schema of the arguments (null: none)
  bool strict = false;  // arguments follow the schema; else any text up to </function>
};

struct OutputSpec {
  bool json = false;                                // the reply is a JSON value...
  const nlohmann::ordered_json* schema = nullptr;   // ...of this schema (null: any JSON object)
  std::vector<ToolGrammar> tools;                   // calls the reply may make (with json: instead of the JSON)
  bool parallel_calls = true;                       // more than one call
  std::string prefix;                               // written first ("\n\n" after a think block)
  // One call after its "<tool_call>" token (tool_choice auto): the grammar starts just after it.
  bool after_trigger = false;
};

// The grammar, or a Status whose message is for the client (unsupported keywords, bad names, a
// schema no finite value satisfies).
Result<std::shared_ptr<const Grammar>> output_grammar(const OutputSpec& spec);

}  // namespace lily::structured
