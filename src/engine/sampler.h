// Token sampling on a backend's fp32 logits: penalties, temperature, top-k, top-p, min-p and a
// seeded draw. Temperature 0 is greedy (ties to the lowest id, like the model's argmax), so a
// request with a seed, or at temperature 0, is reproducible run to run. The draw itself is
// model/draw.h's draw_row (defined in core/sample_math.h), the same one a backend makes where the
// logits are: the sampler keeps the request's state (generator, token counts) and writes the spec.
#pragma once
#include "model/draw.h"
#include "model/logits.h"  // argmax: ties go to the lowest id
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

namespace lily {

struct SamplingParams {
  float temperature = 1.0f;       // 0 = greedy
  float top_p = 1.0f;             // (0, 1]
  int top_k = 0;                  // 0 = off
  float min_p = 0.0f;             // [0, 1]; relative to the most likely token
  float presence_penalty = 0.0f;  // OpenAI: subtracted once if the token was generated
  float frequency_penalty = 0.0f; // OpenAI: subtracted per occurrence in the generated text
  float repetition_penalty = 1.0f;  // HF/CTRL: over prompt and generated tokens
  std::optional<uint64_t> seed;   // none = random
  int top_logprobs = -1;          // -1 = no logprobs; 0..20 = logprob of the chosen + top N
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// The chosen token, and (when asked) its log-probability under the model's raw distribution and
// the top alternatives, most likely first.
struct SampleResult {
  int32_t id = 0;
  std::optional<float> logprob;
  std::vector<TokenLogprob> top;
};

class Sampler {
 public:
  // prompt: the tokens the repetition penalty also covers.
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt);

  // logits: [vocab] fp32, the model's raw row. Draws as draw_row does with next_spec(allowed),
  // and records the chosen token so later penalties see it.
  // allowed (optional): a bitset over the vocabulary; other tokens are never chosen. The
  // log-probabilities still describe the model's raw distribution.
  SampleResult sample(std::span<const float> logits, std::span<const uint64_t> allowed = {});

  // Records a token that was fed without sampling (forced output), for the penalties.
  void accept(int32_t id);

  // Whether a backend can make this request's draws where the logits are (model/draw.h): at most
  // kMaxDrawTop log-probabilities and kMaxDrawPenalties penalised tokens (a longer list is
  // sampled on the host rather than uploaded each step).
  bool device_drawable() const;
  // Whether the next draw depends on the tokens drawn before (penalties): its spec must wait for
  // the previous token's accept().
  bool penalized() const;
  // The spec of the next draw (requires device_drawable()), taking the uniform from this
  // sampler's generator exactly as sample() would: the same seed gives the same tokens either
  // way. Its penalties point into this sampler and `allowed` stays the caller's: both valid until
  // the next accept(). Call accept() with the drawn id after.
  DrawSpec device_spec(std::span<const uint64_t> allowed = {});
  // Whether every draw is the argmax (temperature 0 or top_k 1): no uniform is taken.
  bool greedy() const;

 private:
  DrawPenalty& penalty_entry(int32_t id);

  SamplingParams p_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> generated_counts_;  // for presence/frequency
  std::vector<DrawPenalty> penalties_;                  // one per penalised token (DrawSpec::penalties)
  std::unordered_map<int32_t, size_t> penalty_at_;      // token -> index in penalties_
  DrawScratch scratch_;
};

// log_softmax of `logits` at `id`, and the top `k` entries (k <= 20), from raw logits.
void compute_logprobs(std::span<const float> logits, int32_t id, int k, SampleResult& out);


}  // namespace lily
