// ReplyParser: see reply_parser.h.
#include "server/reply_parser.h"

namespace lily {

ReplyParser::ReplyParser(const ReplyParserOptions& o)
    : o_(o), reasoning_(o.in_reasoning), tools_(o.tools, o.parallel_tool_calls, o.id_seed) {}

ReplyDelta ReplyParser::route(ReasoningParser::Delta d, bool final) {
  ReplyDelta out;
  out.add_text(ReplyItem::Kind::kReasoning, d.reasoning);
  if (!o_.parse_tools) {
    out.add_text(ReplyItem::Kind::kContent, d.content);
    return out;
  }
  tools_.push(d.content, out);
  if (final) tools_.flush(out);
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
