// StopMatcher: see stop_matcher.h. Pending text stays short (below the longest stop string), so
// re-scanning it on every piece is cheap.
#include "engine/stop_matcher.h"

#include <algorithm>

namespace lily {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Out StopMatcher::push(std::string_view piece) {
  Out out;
  if (stopped_) return out;
  pending_.append(piece);
  if (stops_.empty()) {
    out.text.swap(pending_);
    return out;
  }
  // The earliest complete match wins.
  size_t first = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stops_)
    if (size_t at = pending_.find(s); at < first || (at == first && at != std::string::npos && s.size() > which->size()))
      first = at, which = &s;
  if (first != std::string::npos) {
    out.text = pending_.substr(0, first);
    out.stopped = stopped_ = true;
    out.matched = *which;
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  out.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string s;
  if (!stopped_) s.swap(pending_);
  return s;
}

}  // namespace lily
