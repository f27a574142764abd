#include "model/logits.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace lily {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = int32_t(i);
  return best;
}

static double log_sum_exp(std::span<const float> logits) {
  double mx = -INFINITY;
  for (float v : logits) mx = std::max(mx, double(v));
  double s = 0;
  for (float v : logits) s += std::exp(double(v) - mx);
  return mx + std::log(s);
}

double logprob_of(std::span<const float> logits, int32_t id) { return double(logits[id]) - log_sum_exp(logits); }

std::vector<std::pair<int32_t, double>> top_logprobs(std::span<const float> logits, int k) {
  k = std::min<int>(k, int(logits.size()));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double lse = log_sum_exp(logits);
  std::vector<std::pair<int32_t, double>> out;
  for (int i = 0; i < k; ++i) out.push_back({idx[i], double(logits[idx[i]]) - lse});
  return out;
}

}  // namespace lily
