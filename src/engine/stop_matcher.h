// Stop strings over a stream of text pieces. Text that could still be the start of a stop string
// is held back until it is known not to be, so a client never sees part of a stop string.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace lily {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Out {
    std::string text;    // safe to emit now
    bool stopped = false;  // a stop string matched; `text` ends just before it
    std::string matched;   // which one
  };
  // Feeds the next piece. After a stop, further pushes return nothing.
  Out push(std::string_view piece);
  // End of generation: releases the held-back text.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // not yet emitted
  bool stopped_ = false;
};

}  // namespace lily
