// ReplyParser: see reply_parser.h.
#include "server/reply_parser.h"

namespace lily {

void ReplyDelta::append(ReplyDelta&& d) {
  reasoning += d.reasoning;
  content += d.content;
  for (auto& c : d.calls) calls.push_back(std::move(c));
}

ReplyParser::ReplyParser(const ReplyParserOptions& o)
    : o_(o), reasoning_(o.in_reasoning), tools_(o.tools, o.parallel_tool_calls, o.id_seed) {}

ReplyDelta ReplyParser::route(ReasoningParser::Delta d, bool final) {
  ReplyDelta out;
  out.reasoning = std::move(d.reasoning);
  if (!o_.parse_tools) {
    out.content = std::move(d.content);
    return out;
  }
  auto t = tools_.push(d.content);
  if (final) {
    auto f = tools_.flush();
    t.content += f.content;
    for (auto& c : f.calls) t.calls.push_back(std::move(c));
  }
  out.content = std::move(t.content);
  out.calls = std::move(t.calls);
  return out;
}

ReplyDelta ReplyParser::push(std::string_view piece) {
  if (!o_.parse_reasoning) return route({"", std::string(piece)}, false);
  return route(reasoning_.push(piece), false);
}

ReplyDelta ReplyParser::flush() {
  if (!o_.parse_reasoning) return route({}, true);
  return route(reasoning_.flush(), true);
}

}  // namespace lily
