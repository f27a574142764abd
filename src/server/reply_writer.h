// What each API (OpenAI chat and completions, OpenAI Responses, Anthropic Messages) turns engine
// events into: SSE frames while streaming, or one body at the end. The HTTP side (generation.h)
// is shared and knows only this interface. Every writer parses each choice's text the same way
// (ChoiceParse: reasoning, content and tool calls in order), so streamed and whole replies match.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/reply_parser.h"

namespace lily {

class ReplyWriter {
 public:
  virtual ~ReplyWriter() = default;
  // Frames to send before any event (e.g. response.created).
  virtual std::vector<std::string> begin() { return {}; }
  // One engine event of choice `choice` (0 when n = 1): the frames it makes. Non-streaming
  // callers ignore them; the writer keeps what whole() needs either way.
  virtual std::vector<std::string> on_event(int choice, const GenEvent& ev) = 0;
  // After every choice's last event: the closing frames (usage, [DONE], response.completed, ...).
  virtual std::vector<std::string> end() = 0;
  // The non-streaming response body.
  virtual nlohmann::json whole() = 0;
  // An error in this API's shape, as a body and as a frame inside a stream.
  virtual nlohmann::json error_body(const ApiError& e) const { return e.to_json(); }
  virtual std::string error_frame(const ApiError& e) const;
  virtual const std::string& id() const = 0;

  // For the log line: totals over the choices.
  GenUsage usage() const { return usage_; }
  FinishReason finish() const { return finish_; }

 protected:
  // A done event's usage: the prompt's from choice 0 (the others continue its state), completion
  // tokens summed over the choices.
  void record(int choice, const GenEvent& ev);
  GenUsage usage_;
  FinishReason finish_ = FinishReason::kStop;
};

// One choice's text parsed as it arrives, with what whole replies need accumulated.
struct ChoiceParse {
  explicit ChoiceParse(const ReplyParserOptions& o) : parser(o) {}
  // Feeds an event: the items it makes (flushed on the last event), counted as reasoning tokens
  // while the parser is in the think block.
  ReplyDelta feed(const GenEvent& ev);
  ReplyParser parser;
  ReplyDelta all;            // every item so far (merged)
  int reasoning_tokens = 0;
  bool done = false;
  GenEvent last;             // the done event (finish, usage, stop string)
};

// "data: {json}\n\n", and the typed form "event: NAME\ndata: {json}\n\n".
std::string sse_data(const nlohmann::json& j);
std::string sse_event(const std::string& name, const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
// A random id: prefix + 24 alphanumerics.
std::string random_id(const char* prefix);

}  // namespace lily
