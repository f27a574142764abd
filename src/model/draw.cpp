// set_logprobs and draw_row: see draw.h.
#include "model/draw.h"

#include <algorithm>
#include <utility>

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

void draw_row(std::span<const float> logits, const DrawSpec& spec, Drawn& out, DrawScratch& s) {
  std::span<const float> l = logits;
  if (draw_edits_logits(spec)) {
    s.edited.assign(logits.begin(), logits.end());
    if (spec.allowed) apply_token_mask(s.edited, std::span<const uint64_t>(spec.allowed, size_t(spec.n_allowed)));
    apply_draw_penalties(s.edited, std::span<const DrawPenalty>(spec.penalties, size_t(spec.n_penalties)),
                         spec.repetition);
    l = s.edited;
  }
  const int32_t best = argmax_fast(l);
  if (!(spec.inv_t > 0.0f)) out.id = best;
  else if (draw_is_filtered(spec)) out.id = draw_filtered(l, best, spec.inv_t, spec.cuts, spec.u, s.w, s.keys);
  else out.id = draw_inverse_cdf(l, best, spec.inv_t, spec.u, s.w, s.sums);
  out.n_top = 0;
  out.logprob = 0.0f;
  if (spec.top_logprobs >= 0) set_logprobs(logits, spec.top_logprobs, out);
}

void draw_row(std::span<const float> logits, const DrawSpec& spec, Drawn& out, std::vector<float>& w,
              std::vector<double>& sums) {
  DrawScratch s;
  s.w.swap(w), s.sums.swap(sums);
  draw_row(logits, spec, out, s);
  s.w.swap(w), s.sums.swap(sums);
}

}  // namespace lily
