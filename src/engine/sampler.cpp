// Sampler: see sampler.h. Candidates are filtered to those within e^-40 of the best before
// sorting, so top-p on a 250k vocab sorts a few hundred entries, not the whole vocabulary.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/status.h"
#include "core/sample_math.h"

namespace lily {

void compute_logprobs(std::span<const float> logits, int32_t id, int k, SampleResult& out) {
  Drawn d;  // the values the API reports: log-sum-exp in double (model/draw.h)
  d.id = id;
  set_logprobs(logits, k, d);
  out.logprob = d.logprob;
  out.top.clear();
  for (int i = 0; i < d.n_top; ++i) out.top.push_back({d.top_id[i], d.top_logprob[i]});
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt) : p_(params) {
  rng_.seed(p_.seed ? *p_.seed : std::random_device{}());
  if (p_.repetition_penalty != 1.0f)
    for (int32_t t : prompt) seen_[t] = 1;
}

void Sampler::accept(int32_t id) {
  generated_counts_[id]++;
  if (p_.repetition_penalty != 1.0f) seen_[id] = 1;
}

void Sampler::apply_penalties(std::span<float> logits) const {
  const int32_t n = int32_t(logits.size());
  if (p_.repetition_penalty != 1.0f) {
    for (auto& [t, _] : seen_) {
      if (t < 0 || t >= n) continue;
      float& l = logits[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    for (auto& [t, c] : generated_counts_) {
      if (t < 0 || t >= n) continue;
      logits[t] -= p_.presence_penalty + p_.frequency_penalty * float(c);
    }
  }
}

// A uniform double in [0, 1) from the top 53 bits: the same sequence on every platform.
static double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

int32_t Sampler::draw(std::span<float> logits) {
  if (greedy()) return argmax_fast(logits);
  const int32_t best = argmax_fast(logits);
  const float mx = logits[best];
  const float inv_t = 1.0f / p_.temperature;
  const size_t V = logits.size();
  if (plain_draw()) return draw_inverse_cdf(logits, best, inv_t, uniform01(rng_), wf_, w_);
  // Candidates: everything with a non-negligible weight.
  idx_.clear();
  for (int32_t i = 0; i < int32_t(V); ++i)
    if ((logits[i] - mx) * inv_t > -40.0f) idx_.push_back(i);
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t n = idx_.size();
  if (p_.top_k > 0 && size_t(p_.top_k) < n) {
    std::partial_sort(idx_.begin(), idx_.begin() + p_.top_k, idx_.end(), better);
    n = size_t(p_.top_k);
  } else {
    std::sort(idx_.begin(), idx_.end(), better);
  }
  std::vector<double> w(n);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += (w[i] = std::exp((double(logits[idx_[i]]) - mx) * double(inv_t)));
  // min-p: drop tokens less likely than min_p times the best one (w[0] is the best, = 1).
  if (p_.min_p > 0.0f) {
    size_t keep = 1;
    while (keep < n && w[keep] >= p_.min_p * w[0]) ++keep;
    for (size_t i = keep; i < n; ++i) total -= w[i];
    n = keep;
  }
  // top-p: the smallest prefix whose probability reaches top_p.
  if (p_.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = 0;
    while (keep < n) {
      cum += w[keep++];
      if (cum >= p_.top_p * total) break;
    }
    n = keep;
    total = cum;
  }
  double u = uniform01(rng_) * total;
  for (size_t i = 0; i < n; ++i) {
    u -= w[i];
    if (u < 0.0) return idx_[i];
  }
  return idx_[n - 1];
}

bool Sampler::greedy() const { return p_.temperature <= 0.0f || p_.top_k == 1; }

bool Sampler::plain_draw() const { return p_.top_k <= 0 && p_.min_p <= 0.0f && p_.top_p >= 1.0f; }

bool Sampler::device_drawable() const {
  const bool no_penalty = p_.repetition_penalty == 1.0f && p_.presence_penalty == 0.0f && p_.frequency_penalty == 0.0f;
  return no_penalty && (greedy() || plain_draw()) && p_.top_logprobs <= kMaxDrawTop;
}

DrawSpec Sampler::device_spec() {
  DrawSpec d;
  d.top_logprobs = p_.top_logprobs;
  if (!greedy()) {
    d.inv_t = 1.0f / p_.temperature;
    d.u = uniform01(rng_);  // the draw sample() would take from the stream
  }
  return d;
}

void apply_token_mask(std::span<float> logits, std::span<const uint64_t> allowed) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w * 64 < logits.size(); ++w) {
    const size_t base = w * 64, end = std::min(logits.size(), base + 64);
    const uint64_t bits = w < allowed.size() ? allowed[w] : 0;
    if (bits == 0) {
      std::fill(logits.begin() + long(base), logits.begin() + long(end), ninf);
      continue;
    }
    for (uint64_t off = ~bits; off; off &= off - 1) {  // the disallowed ones only
      const size_t i = base + size_t(__builtin_ctzll(off));
      if (i < end) logits[i] = ninf;
    }
  }
}

SampleResult Sampler::sample(std::span<float> logits, std::span<const uint64_t> allowed) {
  SampleResult r;
  // Logprobs describe the model's distribution, before penalties and temperature (as vLLM's
  // default does); so they are taken from the raw logits.
  std::vector<float> raw;
  if (p_.top_logprobs >= 0) raw.assign(logits.begin(), logits.end());
  if (!allowed.empty()) apply_token_mask(logits, allowed);
  apply_penalties(logits);
  r.id = draw(logits);
  if (p_.top_logprobs >= 0) compute_logprobs(raw, r.id, p_.top_logprobs, r);
  accept(r.id);
  return r;
}

}  // namespace lily
