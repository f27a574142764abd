// How a decode row's next token is drawn where its logits are: greedy or an inverse-CDF draw at a
// temperature (core/sample_math.h defines it op for op), plus the chosen token's log-probability
// and the top alternatives. The engine asks for this instead of whole logits rows when a request
// has no penalties or filters, so a GPU backend returns a few bytes per row instead of 1 MB.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace lily {

constexpr int kMaxDrawTop = 20;

struct DrawSpec {
  float inv_t = 0.0f;     // 1 / temperature; 0 = greedy (argmax, lowest id on ties)
  double u = 0.0;         // uniform in [0, 1) from the request's own generator (inv_t > 0)
  int top_logprobs = -1;  // -1: no log-probabilities; 0..kMaxDrawTop: the chosen one + this many
};

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

// The host definition (backends without a device draw use it; tests compare device draws with
// it). w and sums are scratch.
void draw_row(std::span<const float> logits, const DrawSpec& spec, Drawn& out, std::vector<float>& w,
              std::vector<double>& sums);

}  // namespace lily
