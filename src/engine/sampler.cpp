// Sampler: see sampler.h.
#include "engine/sampler.h"

#include <algorithm>

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
    for (int32_t t : prompt) penalty_entry(t).flags |= kPenaltyRepeat;
}

DrawPenalty& Sampler::penalty_entry(int32_t id) {
  auto [it, fresh] = penalty_at_.try_emplace(id, penalties_.size());
  if (fresh) penalties_.push_back(DrawPenalty{id, 0, 0.0f});
  return penalties_[it->second];
}

void Sampler::accept(int32_t id) {
  const int c = ++generated_counts_[id];
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    DrawPenalty& e = penalty_entry(id);
    e.flags |= kPenaltySubtract;
    e.sub = p_.presence_penalty + p_.frequency_penalty * float(c);
  }
  if (p_.repetition_penalty != 1.0f) penalty_entry(id).flags |= kPenaltyRepeat;
}

// A uniform double in [0, 1) from the top 53 bits: the same sequence on every platform.
static double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

bool Sampler::greedy() const { return p_.temperature <= 0.0f || p_.top_k == 1; }

bool Sampler::penalized() const {
  return p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
}

bool Sampler::device_drawable() const {
  return penalties_.size() <= size_t(kMaxDrawPenalties) && p_.top_logprobs <= kMaxDrawTop;
}

DrawSpec Sampler::device_spec(std::span<const uint64_t> allowed) {
  DrawSpec d;
  d.top_logprobs = p_.top_logprobs;
  if (!greedy()) {
    d.inv_t = 1.0f / p_.temperature;
    d.u = uniform01(rng_);  // one uniform per draw from the request's stream
    d.cuts.top_k = std::max(p_.top_k, 0);
    d.cuts.top_p = p_.top_p;
    d.cuts.min_p = p_.min_p;
  }
  d.repetition = p_.repetition_penalty;
  d.n_penalties = int(penalties_.size());
  d.penalties = penalties_.data();
  if (!allowed.empty()) d.allowed = allowed.data(), d.n_allowed = int(allowed.size());
  return d;
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const uint64_t> allowed) {
  Drawn d;
  draw_row(logits, device_spec(allowed), d, scratch_);
  SampleResult r;
  r.id = d.id;
  if (p_.top_logprobs >= 0) {
    r.logprob = d.logprob;
    for (int i = 0; i < d.n_top; ++i) r.top.push_back({d.top_id[i], d.top_logprob[i]});
  }
  accept(r.id);
  return r;
}

}  // namespace lily
