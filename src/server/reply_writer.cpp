// ReplyWriter helpers: see reply_writer.h.
#include "server/reply_writer.h"

#include <random>

namespace lily {

using nlohmann::json;

std::string sse_data(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

std::string sse_event(const std::string& name, const json& j) {
  return "event: " + name + "\n" + sse_data(j);
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

std::string ReplyWriter::error_frame(const ApiError& e) const { return sse_data(error_body(e)); }

void ReplyWriter::record(int choice, const GenEvent& ev) {
  if (!ev.done) return;
  if (choice == 0) {
    usage_.prompt_tokens = ev.usage.prompt_tokens;
    usage_.cached_tokens = ev.usage.cached_tokens;
  }
  usage_.completion_tokens += ev.usage.completion_tokens;
  if (choice == 0 || ev.finish == FinishReason::kLength) finish_ = ev.finish;
}

ReplyDelta ChoiceParse::feed(const GenEvent& ev) {
  if (parser.in_reasoning()) reasoning_tokens += int(ev.tokens.size());
  ReplyDelta d = parser.push(ev.text);
  if (ev.done) {
    d.append(parser.flush());
    done = true;
    last = ev;
  }
  ReplyDelta copy = d;
  all.append(std::move(copy));
  return d;
}

}  // namespace lily
