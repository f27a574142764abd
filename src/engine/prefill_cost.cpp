// PrefillCost: see prefill_cost.h.
#include "engine/prefill_cost.h"

#include <algorithm>
#include <cmath>

namespace lily {

void PrefillCost::add(size_t n, double seconds) {
  if (n == 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  n_[next_] = double(n), s_[next_] = seconds;
  next_ = (next_ + 1) % kWindow;
  count_ = std::min(count_ + 1, kWindow);
  fit();
}

void PrefillCost::fit() {
  const double k = double(count_);
  double mn = 0, ms = 0;
  for (size_t i = 0; i < count_; ++i) mn += n_[i], ms += s_[i];
  mn /= k, ms /= k;
  double cov = 0, var = 0;
  for (size_t i = 0; i < count_; ++i) cov += (n_[i] - mn) * (s_[i] - ms), var += (n_[i] - mn) * (n_[i] - mn);
  // With one chunk size seen (or a slope the noise made useless), all of it is per token: that
  // overestimates small chunks, never underestimates big ones.
  const double b = var > 0 ? cov / var : 0;
  if (var <= 0 || b <= 0 || ms - b * mn < 0) {
    per_token_ = ms / mn;
    fixed_ = 0;
  } else {
    per_token_ = b;
    fixed_ = ms - b * mn;
  }
}

size_t PrefillCost::tokens_within(double seconds) const {
  if (!known() || seconds <= fixed_) return 0;
  const double n = (seconds - fixed_) / per_token_;
  return n >= 1e9 ? size_t(1e9) : size_t(n);
}

}  // namespace lily
