// How a decode row's next token is drawn where its logits are: the token mask and the penalties,
// then greedy, the plain inverse-CDF draw at a temperature or the filtered draw (top-k, min-p,
// top-p), all defined op for op in core/sample_math.h; plus the chosen token's log-probability and
// the top alternatives from the raw logits. The engine asks for this instead of whole logits rows,
// so a GPU backend returns a few bytes per row instead of 1 MB.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/sample_math.h"

namespace lily {

constexpr int kMaxDrawTop = 20;
// Penalty entries one spec may carry (a backend uploads them with the spec each step; 48 KB). A
// request with more distinct penalised tokens is sampled on the host (Sampler::device_drawable).
constexpr int kMaxDrawPenalties = 4096;

struct DrawSpec {
  float inv_t = 0.0f;     // 1 / temperature; 0 = greedy (argmax, lowest id on ties)
  double u = 0.0;         // uniform in [0, 1) from the request's own generator (inv_t > 0)
  int top_logprobs = -1;  // -1: no log-probabilities; 0..kMaxDrawTop: the chosen one + this many
  DrawCuts cuts;          // any cut on (inv_t > 0): draw_filtered, else draw_inverse_cdf
  float repetition = 1.0f;                 // the repetition penalty of kPenaltyRepeat entries
  int n_penalties = 0;                     // 0..kMaxDrawPenalties
  const DrawPenalty* penalties = nullptr;  // [n_penalties], one per token
  int n_allowed = 0;                       // words of `allowed`
  const uint64_t* allowed = nullptr;       // token mask (apply_token_mask); nullptr = every token
};

// Whether the spec's draw is draw_filtered (a temperature draw with a cut).
LILY_HD inline bool draw_is_filtered(const DrawSpec& s) {
  return s.inv_t > 0.0f && (s.cuts.top_k > 0 || s.cuts.top_p < 1.0f || s.cuts.min_p > 0.0f);
}
// Whether the spec changes the logits before the draw (mask or penalties).
LILY_HD inline bool draw_edits_logits(const DrawSpec& s) { return s.allowed != nullptr || s.n_penalties > 0; }

struct Drawn {
  int32_t id = 0;
  float logprob = 0.0f;   // log_softmax(logits)[id] when top_logprobs >= 0
  int n_top = 0;
  int32_t top_id[kMaxDrawTop] = {};
  float top_logprob[kMaxDrawTop] = {};
};

// out.logprob = log_softmax(logits)[out.id] and the top min(k, kMaxDrawTop) alternatives, most
// likely first, ties to the lower id (log-sum-exp in double).
void set_logprobs(std::span<const float> logits, int k, Drawn& out);

// Scratch of draw_row, reused across calls.
struct DrawScratch {
  std::vector<float> edited;   // the row after the mask and penalties
  std::vector<float> w;        // weights
  std::vector<double> sums;    // block sums of the plain draw
  std::vector<uint64_t> keys;  // candidates of the filtered draw
};

// The host definition (backends without a device draw use it; tests compare device draws with
// it): logits are the raw row; the mask and penalties apply to a copy, the log-probabilities
// describe the raw row.
void draw_row(std::span<const float> logits, const DrawSpec& spec, Drawn& out, DrawScratch& scratch);
// The same with the plain draw's scratch only (the rest is allocated when a spec needs it).
void draw_row(std::span<const float> logits, const DrawSpec& spec, Drawn& out, std::vector<float>& w,
              std::vector<double>& sums);

}  // namespace lily
