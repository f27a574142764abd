// set_logprobs and draw_row: see draw.h.
#include "model/draw.h"

#include <algorithm>

#include "core/sample_math.h"

namespace lily {

void set_logprobs(std::span<const float> logits, int k, Drawn& out) {
  const double log_z = log_sum_exp(logits);
  out.logprob = float(double(logits[size_t(out.id)]) - log_z);
  const auto top = top_k_ids(logits, std::clamp(k, 0, kMaxDrawTop));
  out.n_top = int(top.size());
  for (size_t i = 0; i < top.size(); ++i) {
    out.top_id[i] = top[i];
    out.top_logprob[i] = float(double(logits[size_t(top[i])]) - log_z);
  }
}

void draw_row(std::span<const float> logits, const DrawSpec& spec, Drawn& out, std::vector<float>& w,
              std::vector<double>& sums) {
  const int32_t best = argmax_fast(logits);
  out.id = spec.inv_t > 0.0f ? draw_inverse_cdf(logits, best, spec.inv_t, spec.u, w, sums) : best;
  out.n_top = 0;
  out.logprob = 0.0f;
  if (spec.top_logprobs >= 0) set_logprobs(logits, spec.top_logprobs, out);
}

}  // namespace lily
