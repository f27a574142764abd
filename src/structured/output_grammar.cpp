// output_grammar: see output_grammar.h. A call is written as the Qwen template writes one:
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// with parameters in schema order, required ones always present.
#include "structured/output_grammar.h"

#include <fmt/format.h>

#include "structured/json_schema.h"

namespace lily::structured {

using ojson = nlohmann::ordered_json;

namespace {

bool plain_name(const std::string& s) {
  if (s.empty() || s.front() == ' ' || s.back() == ' ') return false;
  for (char c : s)
    if (c == '<' || c == '>' || c == '\n' || c == '\r' || c == '\t') return false;
  return true;
}

// "<function=NAME>\n" PARAMS "</function>\n</tool_call>"
Result<uint32_t> call_body(GrammarBuilder& b, const ToolGrammar& t) {
  if (!plain_name(t.name)) return errorf("tool name '{}' cannot be written in a constrained call", t.name);
  const uint32_t head = b.literal({"<function=" + t.name + ">\n"});
  uint32_t params;
  if (!t.strict) {
    static const auto automaton = raw_automaton("</function>", {"</tool_call>"});
    params = b.text(0, kInf, automaton);
    return b.seq({head, params, b.literal({"\n</tool_call>"})});
  }
  static const ojson kNone = ojson::object();
  const ojson& schema = t.parameters ? *t.parameters : kNone;
  SchemaCompiler sc(b, schema);
  ObjNode o;  // open, sep and close are empty: parameters follow each other
  if (!schema.is_object() && !schema.is_boolean()) return errorf("tool '{}': parameters must be a JSON schema object", t.name);
  if (schema.is_object()) {
    for (const char* k : {"$ref", "anyOf", "allOf", "oneOf"})
      if (schema.contains(k)) return errorf("tool '{}': strict parameters must be an object schema with 'properties' ('{}' is not supported at the top)", t.name, k);
    const ojson empty = ojson::object();
    const ojson& props = schema.contains("properties") ? schema["properties"] : empty;
    if (!props.is_object()) return errorf("tool '{}': 'properties' must be an object", t.name);
    std::vector<std::string> required;
    if (schema.contains("required") && schema["required"].is_array())
      for (const auto& r : schema["required"])
        if (r.is_string()) required.push_back(r.get<std::string>());
    // Compiled for its error checks (unsupported keywords at the top level).
    for (const auto& [k, v] : schema.items())
      if (k != "properties" && k != "required" && k != "type" && k != "additionalProperties" && k != "$defs" &&
          k != "definitions" && k != "title" && k != "description" && k != "$schema" && k != "strict")
        return errorf("tool '{}': '{}' is not supported at the top of strict parameters", t.name, k);
    for (const auto& [k, sub] : props.items()) {
      if (!plain_name(k)) return errorf("tool '{}': parameter name '{}' cannot be written in a constrained call", t.name, k);
      const bool req = std::find(required.begin(), required.end(), k) != required.end();
      o.props.push_back({"<parameter=" + k + ">\n", sc.compile(sub, "#/properties/" + k, ValueSyntax::kToolParam), "\n", req});
    }
    for (const auto& r : required)
      if (!props.contains(r)) return errorf("tool '{}': required parameter '{}' is not in 'properties'", t.name, r);
  }
  if (auto e = sc.error(); !e.empty()) return errorf("tool '{}': {}", t.name, e);
  params = b.object(std::move(o));
  return b.seq({head, params, b.literal({"</function>\n</tool_call>"})});
}

}  // namespace

Result<std::shared_ptr<const Grammar>> output_grammar(const OutputSpec& spec) {
  GrammarBuilder b;
  std::vector<uint32_t> bodies;
  for (const auto& t : spec.tools) {
    auto body = call_body(b, t);
    if (!body) return body.status();
    bodies.push_back(body.value());
  }
  uint32_t root;
  if (spec.after_trigger) {
    if (bodies.empty()) return errorf("no tools to constrain");
    root = b.seq({b.literal({"\n"}), b.alt(bodies)});
  } else {
    std::vector<uint32_t> alts;
    if (spec.json) {
      if (spec.schema) {
        SchemaCompiler sc(b, *spec.schema);
        alts.push_back(sc.compile(*spec.schema, "#"));
        if (auto e = sc.error(); !e.empty()) return Status::error(e);
      } else {  // json_object: any object
        ObjNode o;
        o.open = "{";
        o.sep = ",";
        o.close = "}";
        o.map_key = int32_t(b.text(0, kInf));
        o.map_value = int32_t(b.any_value(5));
        alts.push_back(b.object(std::move(o)));
      }
    }
    if (!bodies.empty()) {
      ArrNode calls;  // one or more calls, one per line
      calls.sep = "\n";
      calls.items = int32_t(b.seq({b.literal({"<tool_call>\n"}), b.alt(bodies)}));
      calls.min = 1;
      calls.max = spec.parallel_calls ? 8 : 1;
      alts.push_back(b.array(std::move(calls)));
    }
    if (alts.empty()) return errorf("nothing to constrain");
    const uint32_t body = alts.size() == 1 ? alts[0] : b.alt(alts);
    root = spec.prefix.empty() ? body : b.seq({b.literal({spec.prefix}), body});
  }
  std::unique_ptr<Grammar> g;
  if (std::string err = b.finish(root, g); !err.empty()) return Status::error(err);
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace lily::structured
