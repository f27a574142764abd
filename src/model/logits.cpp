#include "model/logits.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/sample_math.h"

namespace lily {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = int32_t(i);
  return best;
}

double logprob_of(std::span<const float> logits, int32_t id) { return double(logits[id]) - log_sum_exp(logits); }

std::vector<std::pair<int32_t, double>> top_logprobs(std::span<const float> logits, int k) {
  const double lse = log_sum_exp(logits);
  std::vector<std::pair<int32_t, double>> out;
  for (int32_t i : top_k_ids(logits, k)) out.push_back({i, double(logits[size_t(i)]) - lse});
  return out;
}

}  // namespace lily
