// Splits a reply's text stream into reasoning (inside <think>…</think>) and content, piece by
// piece, holding back anything that could be the start of a marker so a split marker is never
// emitted as text. The prompt decides the start state: Qwen's template opens <think> itself.
#pragma once
#include <string>
#include <string_view>

namespace lily {

// Longest proper prefix of `marker` that `buf` ends with (0 when none).
size_t partial_suffix(std::string_view buf, std::string_view marker);

class ReasoningParser {
 public:
  // in_reasoning: the prompt already opened a think block.
  explicit ReasoningParser(bool in_reasoning);

  struct Delta {
    std::string reasoning, content;
  };
  Delta push(std::string_view piece);
  Delta flush();  // end of reply: releases held text (an unfinished think block stays reasoning)
  bool in_reasoning() const { return mode_ == Mode::kReasoning; }

 private:
  enum class Mode { kStart, kReasoning, kContent };
  void step(Delta& out, bool final);

  Mode mode_;
  bool reasoning_started_ = false;  // leading newlines of the reasoning are dropped
  bool content_started_ = false;    // leading newlines after </think> are dropped
  std::string buf_;
};

}  // namespace lily
