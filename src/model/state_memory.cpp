// StateMemory: see model.h. Pure arithmetic, shared by the engine's memory plan and the backends.
#include <algorithm>

#include "model/model.h"

namespace lily {

size_t StateMemory::alloc_bytes(size_t b) const {
  if (page == 0 || b < page) return b;
  return (b + page - 1) / page * page;
}

int StateMemory::positions_for(int n_tokens, int max_seq) const {
  const int lim = std::max(1, max_seq);
  const int step = std::max(1, position_step);
  const long n = std::clamp(n_tokens, 0, lim);
  const long rounded = (n + step - 1) / step * step;
  return int(std::min<long>(lim, std::max<long>(std::min(initial_positions, lim), rounded)));
}

size_t StateMemory::clone_bytes(int n_tokens, int max_seq) const {
  const long step = std::max(1, position_step), n = std::max(n_tokens, 1);
  return bytes_at(int(std::min<long>(std::max(1, max_seq), (n + step - 1) / step * step)));
}

size_t StateMemory::bytes_at(int positions) const {
  const size_t kv = kv_base + per_position * size_t(std::max(0, positions));
  return alloc_bytes(fixed) + alloc_bytes(kv);
}

}  // namespace lily
